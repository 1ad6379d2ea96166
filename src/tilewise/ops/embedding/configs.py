"""embedding's tuning tables and the rule that picks the backward's path.

Each backward version (``kind``) falls back to the next simpler one past its limits; the block-scan
configuration is a per-call choice (``embedding(..., config=)``), never module state. The numbers
behind the defaults are in docs/tuning/embedding.md, under the section named in the comment.
"""

from __future__ import annotations

from ...runtime import cuda as rt

# The backward versions, in the order they fall back: v1's torch.sort, v2's one-block sort,
# v3's per-warp scan, v4's block scan.
TORCH_SORT, ONE_BLOCK_SORT, SCAN, BLOCK_SCAN = 0, 1, 2, 3

SORT_MAX_IDS = 8192  # 8192 x 8-byte keys = 64 KiB of shared memory for the one-block sort
# The one block also writes the V + 1 segment starts; past this many rows that is slower than
# torch.sort + torch.searchsorted on the whole GPU, so larger tables take v1's path.
ROW_START_MAX = 65536
SCAN_MAX_IDS = 12288   # v3: ids as int32 in shared memory, 48 KiB, no opt-in needed
SCAN_MAX_WORK = 1 << 28  # v3: rows x ids compared; ~2^28 ballots' worth is a few tens of us
SCAN_THREADS = 1024
SCAN_ROWS_PER_BLOCK = (SCAN_THREADS // 32) * 4  # 4 rows a warp (RPW in embedding.cu)
SHMEM_OPT_IN = rt.SM90_SHARED_OPT_IN

# v4_block_scan's (warps NW, ids loaded at once a thread LU, table rows a block RB). The default,
# the fastest of these five at the classifier's shape, is built for every dtype; the others for
# fp32 tables and int64 ids only, for research/embedding_profile.py (docs/tuning/embedding.md,
# "BLOCK_SCAN_DEFAULT").
BLOCK_SCAN_DEFAULT = (4, 8, 32)
BLOCK_SCAN_EXTRA = ((4, 32, 32), (4, 8, 64), (8, 8, 64), (8, 16, 32))


def block_scan_config(config=None) -> tuple[int, int, int]:
    """``config`` as a built block-scan configuration (None: BLOCK_SCAN_DEFAULT); ValueError if it
    is not built."""
    if config is None:
        return BLOCK_SCAN_DEFAULT
    config = tuple(config)
    if config != BLOCK_SCAN_DEFAULT and config not in BLOCK_SCAN_EXTRA:
        raise ValueError(f"embedding: block-scan config {config} is not built; "
                         f"choose from {(BLOCK_SCAN_DEFAULT, *BLOCK_SCAN_EXTRA)}")
    return config


def scan_applies(n: int, V: int, E: int) -> bool:
    """Whether v3_scan's one-kernel backward takes n ids into a (V, E) table."""
    return 0 < n <= SCAN_MAX_IDS and V * n <= SCAN_MAX_WORK and 0 < E <= 256 and V < 2**31


def scan_chunks(E: int) -> int:
    """v3_scan's 32-column chunks a row (its EC template argument) for rows of E elements."""
    return 1 if E <= 32 else 2 if E <= 64 else 4 if E <= 128 else 8


def block_scan_shmem(n: int, E: int, config: tuple | None = None) -> int:
    """v4_block_scan's dynamic shared memory: the warps' partial rows and the ids' local rows."""
    nw, _, rb = config or BLOCK_SCAN_DEFAULT
    return (nw * rb * E + n) * 4


def block_scan_applies(n: int, V: int, E: int, config: tuple | None = None) -> bool:
    """Whether v4_block_scan at ``config`` (default BLOCK_SCAN_DEFAULT) takes n ids into a (V, E)
    table: its shared memory fits a block and the blocks' scans (V / 32 blocks x n ids) stay small."""
    return (0 < n and 0 < E and block_scan_shmem(n, E, config) <= SHMEM_OPT_IN and V * n <= 32 * SCAN_MAX_WORK
            and V < 2**31)


def backward_path(kind: int, n: int, V: int, E: int, config: tuple | None = None) -> int:
    """The backward that runs for version ``kind`` on n ids into a (V, E) table: v4's block scan
    (default) while its shared memory fits and rows x ids <= 2^33; v3's scan up to 12288 ids,
    rows x ids <= 2^28 and E <= 256; v2's one-block sort up to 8192 ids and 65535 rows; else
    v1's torch.sort. The v4 default's 20.7 us against v3's 94 us and torch.embedding's 114 us:
    docs/tuning/embedding.md, "Default backward: v4_block_scan"."""
    if kind == BLOCK_SCAN and block_scan_applies(n, V, E, config):
        return BLOCK_SCAN
    if kind >= SCAN and scan_applies(n, V, E):
        return SCAN
    if kind and 0 < n <= SORT_MAX_IDS and V < ROW_START_MAX:
        return ONE_BLOCK_SORT
    return TORCH_SORT
