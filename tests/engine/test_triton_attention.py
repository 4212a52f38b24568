"""The triton attention backend computes what the sdpa backend computes, on the CPU under
Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no GPU): the
same outputs and the same pool contents for decode rows of ragged lengths, prefills over a
cached prefix (chunked prefill), fresh prefills and mixes of them, with contexts scattered
over the pool so every read crosses pages, under grouped-query attention; across consecutive
forwards (the slot table keeps a decoding request's row); and through a CUDA graph's padded
inputs (padding rows store and change nothing)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the triton backend needs the triton package (the test extra)")

from venusrl.engine.attention import SequenceSlots, make_backend  # noqa: E402
from venusrl.engine.attention.triton_kernels import decode_attention  # noqa: E402
from venusrl.engine.config import EngineConfig  # noqa: E402
from venusrl.engine.cuda_graphs import CaptureReport, DecodeGraphs  # noqa: E402
from venusrl.engine.engine import Engine  # noqa: E402
from venusrl.engine.graph_buckets import bucket_for, graph_buckets  # noqa: E402
from venusrl.engine.kv_pool import KVPool  # noqa: E402
from venusrl.model.args import ModelArgs  # noqa: E402
from venusrl.types import SamplingParams  # noqa: E402

SLOTS = 400


def _args(heads: int, kv_heads: int, head_dim: int) -> ModelArgs:
    return ModelArgs(model_type="qwen3", vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
                     num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-6,
                     rope_theta=1e4, rope_scaling=None, max_position_embeddings=4096, tie_word_embeddings=True,
                     qk_norm=True, attention_bias=False)


class _Pair:
    """The two backends over two pools that start equal; every forward goes to both."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, seed: int):
        self.args = _args(heads, kv_heads, head_dim)
        self.g = torch.Generator().manual_seed(seed)
        self.pools = [KVPool(self.args, SLOTS, torch.float32, "cpu") for _ in range(2)]
        for name in ("k", "v"):
            values = torch.randn(self.pools[0].k.shape, generator=self.g)
            for pool in self.pools:
                getattr(pool, name).copy_(values)
        self.sdpa = make_backend("sdpa", self.pools[0], 16)
        self.triton = make_backend("triton", self.pools[1], 16)
        # slots handed out in a random order: a context's tokens are scattered over the pool
        self.free = list(range(SLOTS))
        random.Random(seed).shuffle(self.free)
        self.contexts: dict[str, list[int]] = {}

    def take(self, count: int) -> list[int]:
        return [self.free.pop() for _ in range(count)]

    def forward(self, sequences: list[SequenceSlots]) -> None:
        tokens = sum(s.num_new for s in sequences)
        heads, kv_heads, dim = self.args.num_attention_heads, self.args.num_key_value_heads, self.args.head_dim
        contexts = [self.sdpa.context(sequences), self.triton.context(sequences)]
        if not sequences:  # the runner builds an empty batch's contexts and runs no forward
            return
        for layer in range(self.args.num_hidden_layers):
            q = torch.randn(1, tokens, heads, dim, generator=self.g)
            k = torch.randn(1, tokens, kv_heads, dim, generator=self.g)
            v = torch.randn(1, tokens, kv_heads, dim, generator=self.g)
            expected, got = (context.attend(layer, q, k, v) for context in contexts)
            torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(self.pools[1].k, self.pools[0].k, atol=0, rtol=0)
        torch.testing.assert_close(self.pools[1].v, self.pools[0].v, atol=0, rtol=0)

    def step(self, plan: dict[str, int]) -> None:
        """One forward: each key gets `plan[key]` new tokens (a new key: a fresh prefill,
        or a prefill over a cached prefix when the key is 'cached...')."""
        sequences = []
        for key, new in plan.items():
            if key not in self.contexts:
                prefix = self.take(11) if key.startswith("cached") else []
                self.contexts[key] = prefix
            self.contexts[key] = self.contexts[key] + self.take(new)
            sequences.append(SequenceSlots(key, new, self.contexts[key]))
        self.forward(sequences)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(8, 2, 32), (4, 4, 16), (6, 1, 24)])
def test_decode_prefill_and_chunks_match_sdpa(heads, kv_heads, head_dim):
    pair = _Pair(heads, kv_heads, head_dim, seed=heads + kv_heads)
    pair.step({"a": 7, "b": 1, "cached-c": 5})  # fresh prefill, one-token prompt, prefill over a cached prefix
    pair.step({"a": 1, "b": 1, "cached-c": 9})  # decode rows of ragged lengths, a second chunk
    pair.step({"a": 1, "b": 1, "cached-c": 1, "d": 3})  # decode next to a new prefill
    pair.step({"a": 1, "b": 1, "cached-c": 1})  # pure decode
    pair.step({"b": 1, "a": 1})  # reordered, one request gone


def test_a_context_whose_pages_were_swapped_is_read_from_its_new_slots():
    """The radix cache may replace a running request's pages by identical ones another request
    computed, anywhere in its context, and reuse the old ones: the table follows."""
    pair = _Pair(8, 2, 16, seed=5)
    pair.step({"a": 9, "b": 4})
    pair.step({"a": 1, "b": 1})
    old, new = pair.contexts["a"][3], pair.take(1)[0]
    for pool in pair.pools:  # the same KV in the new slot; the old slot reused with other KV
        pool.k[:, new], pool.v[:, new] = pool.k[:, old], pool.v[:, old]
        pool.k[:, old], pool.v[:, old] = -pool.k[:, old], -pool.v[:, old]
    pair.contexts["a"][3] = new
    pair.step({"a": 1, "b": 1})


@settings(max_examples=8)
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "cached-d", "cached-e"]),
                                st.sampled_from([1, 1, 1, 2, 17]), min_size=0, max_size=5),
                min_size=1, max_size=4))
def test_any_sequence_of_forwards_matches_sdpa(steps):
    pair = _Pair(8, 2, 16, seed=len(steps))
    for plan in steps:
        if sum(len(pair.contexts.get(k, [])) + 11 + n for k, n in plan.items()) > len(pair.free):
            break
        pair.step(plan)


def test_padded_decode_inputs_store_and_change_nothing():
    """What a CUDA graph replays: a decode step padded to its bucket gives the unpadded rows
    the eager outputs and leaves the pool as the eager step does."""
    pair = _Pair(8, 2, 16, seed=3)
    pair.step({"a": 5, "b": 9, "c": 1})
    sequences = []
    for key in ("a", "b", "c"):
        pair.contexts[key] = pair.contexts[key] + pair.take(1)
        sequences.append(SequenceSlots(key, 1, pair.contexts[key]))
    backend = pair.triton
    step = backend.decode_step(sequences, [0, 0, 0], [0, 0, 0])
    size = bucket_for(len(sequences), graph_buckets(16))
    assert size == 4
    _, _, new_slots, new_index, rows, lengths = torch.tensor(step.padded(size, *backend.padding))
    context = backend.decode_context(new_slots, rows, lengths, torch.arange(size))
    backend.write(new_index, new_slots)
    eager = pair.sdpa.context(sequences)
    for layer in range(pair.args.num_hidden_layers):
        q = torch.randn(1, size, 8, 16, generator=pair.g)
        k = torch.randn(1, size, 2, 16, generator=pair.g)
        v = torch.randn(1, size, 2, 16, generator=pair.g)
        got = context.attend(layer, q, k, v)
        expected = eager.attend(layer, q[:, :3], k[:, :3], v[:, :3])
        torch.testing.assert_close(got[:, :3], expected, atol=2e-5, rtol=1e-4)
        assert torch.equal(got[:, 3:], torch.zeros_like(got[:, 3:]))  # a padding row attends over nothing
    torch.testing.assert_close(pair.pools[1].k, pair.pools[0].k, atol=0, rtol=0)


def test_the_engine_generates_the_same_tokens_on_both_backends(tiny_model_dir):
    """Greedy generation with shared prefixes (radix cache hits) and chunked prefill: the
    tokens agree and the log-probs agree to float32 rounding."""
    prompts = [list(range(3, 40)), list(range(3, 40)) + [50, 51], list(range(60, 66)), [7]]
    params = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))
    outputs = {}
    for backend in ("sdpa", "triton"):
        config = EngineConfig(kv_capacity_tokens=512, page_size=4, chunked_prefill_size=16, max_running_requests=8,
                              attention_backend=backend)
        engine = Engine.from_pretrained(tiny_model_dir, config)
        outputs[backend] = engine.generate(prompts, params) + engine.generate(prompts[:2], params)
    for ours, theirs in zip(outputs["triton"], outputs["sdpa"], strict=True):
        assert ours.output_ids == theirs.output_ids
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)


class _Replay:
    """A graph stand-in on the CPU: replay runs the captured function eagerly."""

    def __init__(self, forward, outputs: dict, size: int):
        self.forward, self.outputs, self.size = forward, outputs, size
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.outputs[self.size] = self.forward()


class _EagerGraphs(DecodeGraphs):
    """DecodeGraphs with the capture left out (no CUDA here): everything else, the static
    buffers, the bucket choice, the padding and the runner's graph path, is the real one."""

    def _capture(self) -> CaptureReport:
        for size in self.buckets:
            self.graphs[size] = _Replay(self._forward(size), self.logits, size)
        return CaptureReport(self.buckets, 0.0, 0)


def test_the_graph_path_generates_what_sdpa_generates(tiny_model_dir):
    """Decode steps through the graphs' static, padded inputs (batch 3 in the bucket of 4, then
    fewer as requests finish), prefills eager: the same tokens as the sdpa engine."""
    prompts = [list(range(3, 30)), list(range(40, 45)), [9, 10]]
    params = [SamplingParams(max_new_tokens=n, temperature=0, stop_token_ids=(-1,)) for n in (7, 4, 5)]
    outputs = {}
    for backend in ("sdpa", "triton"):
        config = EngineConfig(kv_capacity_tokens=512, page_size=4, max_running_requests=6, attention_backend=backend)
        engine = Engine.from_pretrained(tiny_model_dir, config)
        if backend == "triton":
            runner = engine.runner
            runner.graphs = _EagerGraphs(runner.model, runner.attention, config.max_running_requests)
            assert runner.graphs.buckets == [1, 2, 4, 6]
        ids = [engine.add_request(p, s) for p, s in zip(prompts, params, strict=True)]
        done = engine.run_to_completion()
        outputs[backend] = [done[i] for i in ids]
    for ours, theirs in zip(outputs["triton"], outputs["sdpa"], strict=True):
        assert ours.output_ids == theirs.output_ids
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
    # the decode steps went through the graphs: three rows in the bucket of 4, then two, then one
    replays = {size: graph.replays for size, graph in runner.graphs.graphs.items()}
    assert replays[4] > 0 and replays[2] > 0 and replays[1] > 0 and replays[6] == 0, replays


@pytest.mark.parametrize("splits", [1, 3, 8])
def test_decode_is_the_same_for_any_number_of_splits(splits):
    """A GPU picks the splits from its SM count and the batch (1 at large batches, up to 16):
    the merge gives the same attention for any count, empty splits included (lengths 1..)."""
    pair = _Pair(8, 2, 16, seed=splits)
    pair.step({"a": 1, "b": 6, "c": 20})
    lengths = torch.tensor([len(pair.contexts[k]) for k in ("a", "b", "c")])
    rows = torch.tensor(pair.triton.table.prepare([SequenceSlots(k, 0, pair.contexts[k]) for k in ("a", "b", "c")]).rows)
    q = torch.randn(3, 8, 16, generator=pair.g)
    pool = pair.pools[1]
    outs = []
    for count in (2, splits):
        out = torch.empty_like(q)
        scratch = (torch.empty(3, 8, count, 16), torch.empty(3, 8, count))
        decode_attention(q, pool.k[0], pool.v[0], pair.triton.table.table, rows, lengths, torch.arange(3), out,
                         *scratch, 0.25)
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "triton"])
def test_a_context_stops_at_the_models_positions_and_a_prompt_past_them_is_refused(tmp_path, backend):
    """The triton slot table is as wide as the longest context: a request that would outgrow it
    ends at it ("length") on every backend, and one that starts past it is a clear error, not
    an engine crash (and its restarts) at the step that reaches it."""
    from venusrl.model.tiny import make_tiny_model

    model_dir = make_tiny_model(tmp_path / "short", max_position_embeddings=32)
    engine = Engine.from_pretrained(model_dir, EngineConfig(kv_capacity_tokens=256, page_size=4,
                                                            attention_backend=backend))
    greedy = SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(-1,))
    (out,) = engine.generate([list(range(3, 31))], greedy)  # 28 + 8 > 32
    assert out.finish_reason == "length" and len(out.output_ids) == 4
    with pytest.raises(ValueError, match="32 tokens leaves no room"):
        engine.add_request(list(range(3, 35)), greedy)
    assert engine.generate([[5, 6, 7]], greedy)[0].output_ids  # the engine serves on
