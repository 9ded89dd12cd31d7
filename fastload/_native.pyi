from typing import Any

def layout_run(
    fd: int,
    offsets: list[int],
    keys: list[str] | tuple[bytes, list[int]],
    key_base: int,
    rows: list[list[int]],
    fields: list[str],
    dot_fields: list[bytes],
    crcs: list[int],
    first: int,
    stop: int,
    max_bytes: int,
    /,
) -> tuple[list[dict[str, Any]], int, bool]: ...
def tfrecord_run(
    fd: int,
    offsets: list[int],
    sizes: list[int],
    keys: list[str],
    stem: str,
    first: int,
    stop: int,
    max_bytes: int,
    /,
) -> tuple[list[dict[str, Any]], int, bool]: ...
def crc32c(data: bytes | bytearray | memoryview, value: int = 0, level: int = ..., /) -> int: ...
def buffer_shuffle(
    n: int, buffer: int, key: bytes, pos: int, at: Any = ..., /
) -> tuple[bytearray, bytes, int]: ...

crc32c_hardware: int

def tar_fill(
    buffer: bytearray,
    fill: int,
    paths: list[str],
    names: list[str],
    sizes: list[int],
    counts: list[int],
    first: int,
    member: int,
    stop: int,
    mtime: int,
    attempts: int,
    /,
) -> tuple[int, int, int, int, list[tuple[int, int, int, int, int]]]: ...
