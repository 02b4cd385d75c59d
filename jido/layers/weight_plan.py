"""The weight plan: which layouts the quantized layers hold beside their codes, chosen under a memory budget.

A quantized layer always holds its codes (:class:`~jido.layers.quant_kernels.QuantizedWeight`), and every step
size runs on them: one row on the rows kernel, more rows on panels packed per call. The other layouts are copies
that make some step sizes faster, each at a price in memory:

- ``five_bits``: Q5_0 codes in five bits; one-row decode reads 5/8 of the codes' bytes.
- ``panels``: the codes prepacked for the panel kernel; steps of two rows or more skip repacking the weight.
- ``amx_gemm`` / ``prefill_int8``: ``w8a8`` / ``gguf_w8a8`` int8 copies for prefill-sized steps.
- ``bf16_copy``: the dequantized weight in bf16, for prefill-sized steps where oneDNN multiplies bf16 natively.

``weights_memory`` bounds them: ``lean`` holds the codes alone, a size bounds codes plus extras, ``auto`` gives the
extras what the host has available once the KV cache and the step workspace are set aside. Extras are added in
:data:`EXTRAS` order (decode speed per byte first) while they fit; one that does not is left out and the next
tried. The plan is settled once the checkpoint is read (so the codes' own bytes are known) and before any layer
packs a copy, so no copy is made and dropped.

A batch-invariant plan (``batch_invariant``) runs every step of every size on the panels, prepacked or packed for the
call, whose sums give a row the same bits in a step of any number of rows, one included; the other routes (the rows
kernel and five-bit rows at one row, the bf16 copy and the int8 GEMMs for many) each sum in an order of their own, so
the step's size would choose a row's bits. It holds the panels alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from jido.config.model import parse_weights_memory
from jido.layers.quantized_layouts import layouts_of

CODES, FIVE_BITS, PANELS, AMX_GEMM, PREFILL_INT8, BF16_COPY = (
    "codes", "five_bits", "panels", "amx_gemm", "prefill_int8", "bf16_copy")
# Extra layouts in the order a budget admits them: what one-row decode and small batches read first (five-bit rows
# at 5/8 byte a weight, panels at about a byte), then prefill's copies (a byte a weight, then bf16's two).
EXTRAS: tuple[str, ...] = (FIVE_BITS, PANELS, AMX_GEMM, PREFILL_INT8, BF16_COPY)
# The extras a batch-invariant plan may hold: what serves its one route.
INVARIANT_EXTRAS = frozenset({PANELS})
# What each layout serves, for the start-up table.
SERVES = {
    CODES: "every step not served below (1 row: rows kernel; 2+: panels packed per call)",
    FIVE_BITS: "1-row steps of Q5_0 layers",
    PANELS: "steps of 2+ rows",
    AMX_GEMM: "w8a8 steps of many rows, on AMX tiles",
    PREFILL_INT8: "gguf_w8a8 prefill-sized steps",
    BF16_COPY: "prefill-sized steps in bf16",
}
# What the layouts of a batch-invariant plan serve: every step size on the panels.
SERVES_INVARIANT = {CODES: "every step not served below (panels packed per call)", PANELS: "steps of every size"}
# The field of a layer's QuantizedLayouts (jido/layers/quantized_layouts.py) holding each extra; the codes are the
# layer's ``qweight``. gguf_w8a8's int8 copy is ``prefill_int_mm`` where it runs on oneDNN; on AMX tiles it is
# ``amx_gemm``, and counts as that.
_HELD_AS = ((FIVE_BITS, "five_bits"), (PANELS, "panels"), (AMX_GEMM, "amx_gemm"), (PREFILL_INT8, "prefill_int_mm"),
            (BF16_COPY, "bf16_copy"))


@dataclass
class WeightPlan:
    """The extra layouts quantized layers may hold, and whether every step size runs on one route
    (``batch_invariant``, see the module docstring). Made with every extra it allows (a layer processed on its own,
    a test, a draft model); :meth:`settle` narrows it once, before the model's layers process their weights."""

    extras: frozenset[str] = frozenset(EXTRAS)
    settled: bool = False
    reason: str = "every layout (no budget)"
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        self.extras = self.extras & self.allowed

    @property
    def allowed(self) -> frozenset[str]:
        """The extras this plan may hold at all: :data:`INVARIANT_EXTRAS` when batch-invariant, else every one."""
        return INVARIANT_EXTRAS if self.batch_invariant else frozenset(EXTRAS)

    def holds(self, layout: str) -> bool:
        return layout == CODES or layout in self.extras

    def settle(self, extras: frozenset[str], reason: str) -> None:
        if self.settled:
            raise RuntimeError("a weight plan is settled once, before the layers process their weights")
        unknown = extras - set(EXTRAS)
        if unknown:
            raise ValueError(f"unknown weight layouts {sorted(unknown)}; known: {list(EXTRAS)}")
        if extras - self.allowed:
            raise ValueError(f"a batch-invariant plan holds {sorted(self.allowed)} only, not "
                             f"{sorted(extras - self.allowed)}")
        if self.batch_invariant:
            reason += "; batch_invariant: every step on the panels"
        self.extras, self.settled, self.reason = extras, True, reason


@dataclass(frozen=True)
class LayoutCosts:
    """Bytes each layout would take across the model: ``codes`` always held, the extras only if the plan admits them."""

    codes: int = 0
    extras: dict[str, int] = field(default_factory=dict)

    def __add__(self, other: LayoutCosts) -> LayoutCosts:
        extras = dict(self.extras)
        for layout, nbytes in other.extras.items():
            extras[layout] = extras.get(layout, 0) + nbytes
        return LayoutCosts(self.codes + other.codes, extras)

    def only(self, layouts: frozenset[str]) -> LayoutCosts:
        """The same costs with the extras outside ``layouts`` left out (those a plan may not hold)."""
        return LayoutCosts(self.codes, {layout: n for layout, n in self.extras.items() if layout in layouts})


def choose_extras(weights_memory: int | str, costs: LayoutCosts,
                  available_bytes: int | None) -> tuple[frozenset[str], str]:
    """The extras admitted and why: none under ``lean``; under a size, those that fit beside the codes in it; under
    ``auto``, those that fit in ``available_bytes`` (every one where that is unknown)."""
    setting = parse_weights_memory(weights_memory)
    if setting == "lean":
        return frozenset(), "weights_memory=lean: the codes alone"
    if setting == "auto":
        if available_bytes is None:
            return frozenset(layout for layout in EXTRAS if layout in costs.extras), \
                "weights_memory=auto, available memory unknown: every layout"
        budget, told = available_bytes, f"weights_memory=auto: {_mib(available_bytes)} available for copies"
    else:
        budget = setting - costs.codes
        told = f"weights_memory={_mib(setting)}: {_mib(max(budget, 0))} beside the codes ({_mib(costs.codes)})"
    admitted: list[str] = []
    for layout in EXTRAS:
        nbytes = costs.extras.get(layout)
        if nbytes is None:
            continue
        if nbytes <= budget:
            admitted.append(layout)
            budget -= nbytes
    left_out = [layout for layout in EXTRAS if layout in costs.extras and layout not in admitted]
    if left_out:
        told += "; left out " + ", ".join(f"{layout} ({_mib(costs.extras[layout])})" for layout in left_out)
    return frozenset(admitted), told


def held_layouts(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Layout -> (bytes, layers holding it) over the model's quantized layers, as held now."""
    held: dict[str, tuple[int, int]] = {}
    seen: set[int] = set()
    for module in model.modules():
        layouts = layouts_of(module)
        values = [(CODES, module.__dict__.get("qweight"))]
        if layouts is not None:
            values += [(layout, getattr(layouts, name)) for layout, name in _HELD_AS]
        for layout, value in values:
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            nbytes, layers = held.get(layout, (0, 0))
            held[layout] = (nbytes + _nbytes(value), layers + 1)
    return held


def format_table(held: dict[str, tuple[int, int]], batch_invariant: bool = False) -> str:
    """The start-up log's table: one line per layout held, with its bytes, layers and the steps it serves (under a
    ``batch_invariant`` plan)."""
    serves = {**SERVES, **SERVES_INVARIANT} if batch_invariant else SERVES
    lines = [f"{'layout':<13}{'MiB':>10}{'layers':>8}  serves"]
    for layout in (CODES, *EXTRAS):
        if layout in held:
            nbytes, layers = held[layout]
            lines.append(f"{layout:<13}{nbytes / 2**20:>10.1f}{layers:>8}  {serves[layout]}")
    total = sum(nbytes for nbytes, _ in held.values())
    lines.append(f"{'total':<13}{total / 2**20:>10.1f}")
    return "\n".join(lines)


def _nbytes(value: object) -> int:
    """Bytes of a tensor, or of a layout dataclass: its own ``nbytes`` where it has one (five-bit rows share their
    scales with the codes, so count their data alone), else the sum of its tensor fields."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    own = getattr(type(value), "nbytes", None)
    if isinstance(own, property):
        return int(value.nbytes)
    tensors = [t for t in vars(value).values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB"
