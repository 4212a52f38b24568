"""The flat layout the handle transports share: packing and viewing give back every tensor
bit for bit (cast to the engine's dtype), tied tensors are packed once, and a layout that
crosses the wire comes back equal or is refused naming what is wrong."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from venusrl.weights.copy import copy_into
from venusrl.weights.layout import ALIGN, WeightLayout

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
dtypes = st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int64])


@given(st.lists(st.tuples(shapes, dtypes), min_size=1, max_size=6), st.sampled_from([None, torch.bfloat16]))
def test_pack_then_views_gives_back_every_tensor_cast(specs, dtype):
    generator = torch.Generator().manual_seed(0)
    weights = {f"t{i}": (torch.randn(shape, generator=generator) * 10).to(kind) for i, (shape, kind) in enumerate(specs)}
    layout = WeightLayout.of(weights, dtype)
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
    layout.pack(weights, buffer)
    views = layout.views(buffer)
    assert set(views) == set(weights)
    for name, tensor in weights.items():
        want = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
        assert views[name].dtype == want.dtype and torch.equal(views[name], want)
    assert all(slot.offset % ALIGN == 0 for slot in layout.slots)
    ends = [(s.offset, s.offset + s.nbytes) for s in layout.slots]
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False)), "slots overlap"
    assert WeightLayout.from_wire(layout.to_wire()) == layout


def test_tied_tensors_are_packed_once_and_named_as_aliases():
    embed = torch.randn(8, 4)
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(4), "lm_head.weight": embed}
    layout = WeightLayout.of(weights)
    assert [s.name for s in layout.slots] == ["model.embed_tokens.weight", "model.norm.weight"]
    assert layout.aliases == (("lm_head.weight", "model.embed_tokens.weight"),)
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
    layout.pack(weights, buffer)
    assert torch.equal(layout.views(buffer)["lm_head.weight"], embed)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda w: w["slots"][1].__setitem__(1, "complex64"), "tensor 'b' has dtype 'complex64'"),
    (lambda w: w["slots"][0].__setitem__(2, [-1]), "tensor 'a' has shape"),
    (lambda w: w["slots"][1].__setitem__(3, 0), "tensor 'b' at offset 0 overlaps"),
    (lambda w: w.__setitem__("nbytes", 8), "tensor 'a' ends at byte 16, past the 8-byte buffer"),
    (lambda w: w["aliases"].append(["x", "nothing"]), "alias"),
    (lambda w: w.pop("slots"), "slots, aliases and nbytes"),
])
def test_a_bad_layout_from_the_wire_is_refused_naming_the_tensor(mutate, message):
    wire = WeightLayout.of({"a": torch.ones(4), "b": torch.ones(2)}).to_wire()
    mutate(wire)
    with pytest.raises(ValueError, match=message):
        WeightLayout.from_wire(wire)


@given(st.integers(1, 200), st.integers(1, 9), st.sampled_from([torch.float32, torch.bfloat16]),
       st.sampled_from(["contiguous", "transposed", "cast"]))
def test_copy_into_writes_every_element_in_any_layout(rows, cols, dtype, kind):
    source = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows)).to(dtype).requires_grad_()
    if kind == "transposed":  # as the engine's fused q/k/v weights are
        target = torch.empty(cols, rows * 2, dtype=dtype)[:, :rows].t()
    else:
        target = torch.empty(rows, cols, dtype=torch.float16 if kind == "cast" else dtype)
    copy_into(target, source)
    assert torch.equal(target, source.detach().to(target.dtype))

