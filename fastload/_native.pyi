from typing import Any

def layout_run(
    fd: int,
    offsets: list[int],
    keys: list[str],
    rows: list[list[int]],
    fields: list[str],
    dot_fields: list[bytes],
    first: int,
    stop: int,
    max_bytes: int,
    /,
) -> tuple[list[dict[str, Any]], int, bool]: ...
