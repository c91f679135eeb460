"""The production layout grouped-moe reads: MXFP4 expert weights repacked once, e8m0 scales in bytes.

`Mxfp4Experts` keeps what SGLang's sm_120 path keeps (e2m1 nibbles row-major, fp32 scales). The
kernels read a copy, built once per weight tensor outside CUDA-graph capture (`packed_experts`):

- **Values** in units of 16 rows x 64 columns (512 bytes). A unit holds one 16-byte word group per
  lane of a warp, lane = 8 row groups (g) x 4 column pairs (q), so a lane's 16-byte load holds
  exactly the values it feeds the tensor core as the A operand of four k16 MMA steps: rows g and
  g + 8, columns 2q, 2q + 1, 2q + 8, 2q + 9 of each step. Each 32-bit word (one k16 step) holds
  four bf16 pairs, pair j = rows g + 8 * (j & 1), columns 8 * (j >> 1) + 2q and + 1, the first
  value in the low half. Each value's four bits (sign, e1, e0, m) sit where a mask, or a shift and
  a mask, puts them at bf16's sign and top exponent and mantissa bits (15, 8, 7, 6 of a half):
  pair 0 there already, pair 1 three bits lower, pair 2 six lower, pair 3 at (14, 11, 10, 13)
  (`BITS`). Decoded: q & M, (q << 3) & M, (q << 6) & M with M = 0x81C081C0, and
  ((q << 1) & 0x80008000) | ((q >> 3) & 0x01800180) | ((q >> 7) & 0x00400040).
- **Scales** as e8m0 bytes (power-of-two exponent + 127), 32 bytes a unit ordered (g, group,
  row half), so a lane's four scales are one 4-byte load.

Unit (rb, kb) of expert e starts at byte ((e * N16 + rb) * K64 + kb) * 512 (scales: * 32);
rows and columns past the weight are zero (scale byte 127). docs/optimizations/grouped_moe.md.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.workload.quant import MXFP4_GROUP

UNIT_ROWS = 16
UNIT_COLS = 64
UNIT_BYTES = UNIT_ROWS * UNIT_COLS // 2
UNIT_SCALES = UNIT_ROWS * UNIT_COLS // MXFP4_GROUP
E8M0_BIAS = 127
# One multiply folds the e2m1 exponent bias (2^126) and the scale 2^(s - 127) into 2^(s - 1), a
# bf16 normal for s <= 128 (scales up to 2); larger scales take two multiplies.
FOLD_MAX_E8M0 = 128
FOLD_EXP_ADD = 126  # the folded multiplier's bf16 bits: (s + 126) << 7 = 2^(s - 1) (fold_multiplier_bits)
BF16_MANTISSA_BITS = 7
# Where each pair's (sign, e1, e0, m) bits sit in the low half of its word (the high half: + 16).
BITS = ((15, 8, 7, 6), (12, 5, 4, 3), (9, 2, 1, 0), (14, 11, 10, 13))


@dataclass(frozen=True)
class PackedExperts:
    """Expert weight sets [R, N, K] in the production layout: values [R, N16, K64, 512] uint8,
    scales [R, N16, K64, 32] uint8 (e8m0), and whether one multiply applies a scale (`fold`)."""

    values: torch.Tensor
    scales: torch.Tensor
    rows: int  # N
    cols: int  # K
    fold: bool

    @property
    def experts(self) -> int:
        return self.values.shape[0]

    @property
    def n16(self) -> int:
        return self.values.shape[1]

    @property
    def k64(self) -> int:
        return self.values.shape[2]

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.scales.nbytes


def fold_multiplier_bits(s: int) -> int:
    """The bf16 bits of the one multiply that decodes e2m1 values of e8m0 scale byte `s` (s <= 128):
    2^(s - 1) = 2^126 (the e2m1 exponent bias the decode leaves) x 2^(s - 127). The Triton kernels'
    FOLD branch and the Gluon kernels' PTX (4 bytes at once) build it from the same constants."""
    return (s + FOLD_EXP_ADD) << BF16_MANTISSA_BITS


def e8m0(scales: torch.Tensor) -> torch.Tensor:
    """fp32 powers of two -> their e8m0 bytes (exponent + 127). Anything else is refused: the
    kernels multiply by 2^(byte - 127) and nothing more."""
    mant, exp = torch.frexp(scales.float())
    ok = (mant == 0.5) & (exp - 1 + E8M0_BIAS >= 1) & (exp - 1 + E8M0_BIAS <= 254)
    if not bool(ok.all()):
        raise DsvOptError("grouped-moe reads MXFP4 scales that are powers of two within e8m0's range (2^-126 .. 2^127); "
                          "these weights hold others")
    return (exp - 1 + E8M0_BIAS).to(torch.uint8)


def _values(packed: torch.Tensor, n16: int, k64: int) -> torch.Tensor:
    """Expert sets [r, N, K/2] -> their units [r, n16, k64, 512] (int32 bit work: few sets at a time)."""
    r, N, K2 = packed.shape
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(r, N, 2 * K2)
    nib = torch.nn.functional.pad(nib, (0, k64 * UNIT_COLS - 2 * K2, 0, n16 * UNIT_ROWS - N))
    # row = rb*16 + rowhalf*8 + g; col = kb*64 + s*16 + khalf*8 + q*2 + h
    nib = nib.view(r, n16, 2, 8, k64, 4, 2, 4, 2)  # r, rb, rowhalf, g, kb, s, khalf, q, h
    nib = nib.permute(0, 1, 4, 3, 7, 5, 8, 6, 2)  # r, rb, kb, g, q, s, h, khalf, rowhalf
    nib = nib.reshape(r, n16, k64, 32, 4, 2, 4).int()  # lane, word s, half h, pair j = 2 * khalf + rowhalf
    word = torch.zeros(nib.shape[:5], dtype=torch.int32, device=nib.device)
    for j, bits in enumerate(BITS):
        for h in range(2):
            for b, pos in enumerate(bits):  # nibble bit 3 - b (sign first)
                word |= ((nib[..., h, j] >> (3 - b)) & 1) << (pos + 16 * h)
    values = torch.stack([(word >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)  # little-endian
    return values.reshape(r, n16, k64, UNIT_BYTES)


def repack(packed: torch.Tensor, scales: torch.Tensor, chunk: int = 8) -> PackedExperts:
    """packed [R, N, K/2] uint8 (even column in the low nibble), scales [R, N, K/32] fp32 powers of
    two -> PackedExperts. Plain torch on the tensors' device, `chunk` sets at a time."""
    R, N, K2 = packed.shape
    K = 2 * K2
    n16, k64 = -(-N // UNIT_ROWS), -(-K // UNIT_COLS)
    values = torch.empty(R, n16, k64, UNIT_BYTES, dtype=torch.uint8, device=packed.device)
    for e in range(0, R, chunk):
        values[e: e + chunk] = _values(packed[e: e + chunk], n16, k64)
    ex = e8m0(scales)
    ex = torch.nn.functional.pad(ex, (0, k64 * 2 - K // MXFP4_GROUP, 0, n16 * UNIT_ROWS - N), value=E8M0_BIAS)
    ex = ex.view(R, n16, 2, 8, k64, 2)  # R, rb, rowhalf, g, kb, gs
    ex = ex.permute(0, 1, 4, 3, 5, 2).reshape(R, n16, k64, UNIT_SCALES).contiguous()
    fold = bool((ex <= FOLD_MAX_E8M0).all())
    return PackedExperts(values, ex, N, K, fold)


def unpack(p: PackedExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `repack`: (packed [R, N, K/2] uint8, scales [R, N, K/32] fp32)."""
    R, n16, k64 = p.experts, p.n16, p.k64
    b = p.values.view(R, n16, k64, 32, 4, 4).long()
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)  # [.., lane, s], little-endian
    nib = torch.zeros(*word.shape, 2, 4, dtype=torch.long, device=word.device)
    for j, bits in enumerate(BITS):
        for h in range(2):
            for b_, pos in enumerate(bits):
                nib[..., h, j] |= ((word >> (pos + 16 * h)) & 1) << (3 - b_)
    nib = nib.view(R, n16, k64, 8, 4, 4, 2, 4)  # R, rb, kb, g, q, s, h, j
    nib = nib.view(R, n16, k64, 8, 4, 4, 2, 2, 2)  # ..., h, khalf, rowhalf
    nib = nib.permute(0, 1, 8, 3, 2, 5, 7, 4, 6).reshape(R, n16 * UNIT_ROWS, k64 * UNIT_COLS)
    nib = nib[:, : p.rows, : p.cols]
    packed = (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8).contiguous()
    ex = p.scales.view(R, n16, k64, 8, 2, 2).permute(0, 1, 5, 3, 2, 4).reshape(R, n16 * UNIT_ROWS, k64 * 2)
    ex = ex[:, : p.rows, : p.cols // MXFP4_GROUP]
    return packed, torch.pow(2.0, ex.float() - E8M0_BIAS).contiguous()


# Keyed on the weight tensors, not on the Mxfp4Experts holding them: torch-compile's opaque op wraps
# the same tensors in a new holder at every call.
_CACHE: dict[tuple, tuple[weakref.ref, weakref.ref, tuple, PackedExperts]] = {}


def _key(experts) -> tuple:
    p, s = experts.packed, experts.scales
    return (p.data_ptr(), tuple(p.shape), s.data_ptr(), tuple(s.shape), str(p.device))


def packed_experts(experts) -> PackedExperts:
    """The production-layout copy of an `Mxfp4Experts`' tensors, built on first use and kept while
    they live (rebuilt if they change in place). Building it inside CUDA-graph capture would record
    the repack into the graph: refused, so an eager step (warm-up, the gate) must come first."""
    key = _key(experts)
    versions = (experts.packed._version, experts.scales._version)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is experts.packed and hit[1]() is experts.scales and hit[2] == versions:
        return hit[3]
    if experts.packed.is_cuda and torch.cuda.is_current_stream_capturing():
        raise DsvOptError("grouped-moe repacks each expert weight once, before CUDA-graph capture: run one eager "
                          "step (a warm-up) before capturing")
    for k in [k for k, v in _CACHE.items() if v[0]() is None or v[1]() is None]:
        del _CACHE[k]  # weights freed since
    p = repack(experts.packed, experts.scales)
    _CACHE[key] = (weakref.ref(experts.packed), weakref.ref(experts.scales), versions, p)
    return p


def cached_bytes() -> int:
    """Device bytes the cached production-layout copies hold (what grouped-moe costs in memory)."""
    return sum(v[3].nbytes for v in _CACHE.values() if v[0]() is not None)
