"""Pure logic: plans, headers and decisions. No files, sockets, threads, clocks, env or torch here."""
