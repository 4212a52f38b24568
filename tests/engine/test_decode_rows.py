"""Decode rows mirror the pool: whatever requests join, leave, skip a step or restart with
recomputed KV, every decoding request's row holds exactly the KV the pool holds for its
context, and rows stay compact."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from venusrl.engine.attention.decode_rows import DecodeRows
from venusrl.engine.kv_pool import KVPool
from venusrl.model.args import ModelArgs

ARGS = ModelArgs(model_type="qwen3", vocab_size=8, hidden_size=4, intermediate_size=8, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=2, rms_norm_eps=1e-6, rope_theta=1e4,
                 rope_scaling=None, max_position_embeddings=512, tie_word_embeddings=True, qk_norm=True,
                 attention_bias=False)
SLOTS = 400


class _Driver:
    """Plays the runner: writes each step's new token to the pool, plans, writes the rows."""

    def __init__(self) -> None:
        self.pool = KVPool(ARGS, SLOTS, torch.float32, "cpu")
        self.rows = DecodeRows(self.pool)
        self.free = list(range(SLOTS))
        self.contexts: dict[str, list[int]] = {}
        self.values = torch.Generator().manual_seed(0)

    def _new_slots(self, count: int) -> list[int]:
        slots = [self.free.pop() for _ in range(count)]
        index = torch.tensor(slots)
        shape = (ARGS.num_hidden_layers, count, ARGS.num_key_value_heads, ARGS.head_dim)
        self.pool.k[:, index] = torch.randn(shape, generator=self.values)
        self.pool.v[:, index] = torch.randn(shape, generator=self.values)
        return slots

    def start(self, key: str, length: int) -> None:
        """A request whose first `length` tokens were computed by a prefill (fresh KV)."""
        self.free.extend(self.contexts.pop(key, []))
        self.contexts[key] = self._new_slots(length)

    def decode(self, keys: list[str]) -> None:
        for key in keys:
            self.contexts[key] = self.contexts[key] + self._new_slots(1)
        plan = self.rows.plan([(key, self.contexts[key]) for key in keys])
        if plan is None:
            return
        new = torch.tensor([self.contexts[key][-1] for key in keys])
        for layer in range(ARGS.num_hidden_layers):
            row_k, row_v = self.rows.layer(layer)
            row_k.view(-1, *row_k.shape[2:]).index_copy_(0, plan.write_index, self.pool.k[layer, new])
            row_v.view(-1, *row_v.shape[2:]).index_copy_(0, plan.write_index, self.pool.v[layer, new])
        self.check(keys)

    def check(self, keys: list[str]) -> None:
        assert sorted(self.rows.row_of.values()) == list(range(len(keys)))
        for key in keys:
            row, slots = self.rows.row_of[key], self.contexts[key]
            index = torch.tensor(slots)
            assert self.rows.lengths[row] == len(slots)
            assert torch.equal(self.rows.k[:, row, : len(slots)], self.pool.k[:, index])
            assert torch.equal(self.rows.v[:, row, : len(slots)], self.pool.v[:, index])


step_actions = st.lists(
    st.tuples(st.sampled_from("abcdefgh"), st.sampled_from(["decode", "skip", "restart"]), st.integers(1, 40)),
    min_size=1, max_size=8, unique_by=lambda action: action[0],
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step_actions, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_rows_always_mirror_the_pool(steps, rng):
    driver = _Driver()
    for actions in steps:
        decoding = []
        for key, action, length in actions:
            if action == "restart" or key not in driver.contexts:
                # a prefill (first, or recomputing the context) is a forward in which the
                # request does not decode; it decodes from the next one on
                driver.start(key, length)
            elif action == "decode":
                decoding.append(key)
        rng.shuffle(decoding)
        driver.decode(decoding)


def test_a_request_that_skips_a_step_is_filled_again_from_the_pool():
    driver = _Driver()
    driver.start("a", 5)
    driver.decode(["a"])
    driver.decode([])  # "a" did not decode (retracted, say): its row is given up
    assert driver.rows.row_of == {}
    index = torch.tensor(driver.contexts["a"])
    driver.pool.k[:, index] += 1  # its KV recomputed under new weights
    driver.decode(["a"])  # check() compares the row with the pool's new KV


def test_rows_and_capacity_grow_on_demand_and_shrink_after_a_long_request():
    driver = _Driver()
    for key in "abc":
        driver.start(key, 3)
    driver.decode(["a", "b", "c"])
    driver.start("d", 150)
    driver.decode(["d", "a", "b", "c"])
    assert driver.rows.k.shape[1] == 4 and driver.rows.k.shape[2] >= 151
    driver.decode(["a", "b", "c"])  # "d" is gone: the short rows are kept, the capacity shrinks
    assert driver.rows.k.shape[2] == 64


def test_a_context_that_did_not_grow_by_exactly_one_token_is_filled_again():
    driver = _Driver()
    driver.start("a", 4)
    driver.decode(["a"])
    driver.contexts["a"] = driver.contexts["a"] + driver._new_slots(1)  # a token the rows never saw
    driver.decode(["a"])
