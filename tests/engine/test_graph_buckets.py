"""CUDA-graph buckets and padding, without a GPU: every batch size up to the bound has a
bucket, the smallest that holds it; the ladder is 1, 2, 4, 8, then steps of 16; padding keeps
the real rows and makes the rest harmless (no K/V stored, the scratch table row, length 0)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from venusrl.engine.graph_buckets import DecodeStep, bucket_for, graph_buckets


def test_the_ladder_for_the_default_bound():
    assert graph_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_buckets(100) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100]
    assert graph_buckets(5) == [1, 2, 4, 5]
    assert graph_buckets(1) == [1]
    with pytest.raises(ValueError, match="max_running_requests"):
        graph_buckets(0)


@given(st.integers(1, 600), st.integers(0, 700))
def test_every_batch_gets_the_smallest_bucket_that_holds_it(max_batch, batch):
    buckets = graph_buckets(max_batch)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_batch
    assert all(b in (1, 2, 4, 8) or b % 16 == 0 or b == max_batch for b in buckets)
    size = bucket_for(batch, buckets)
    if batch < 1 or batch > max_batch:
        assert size is None
        return
    assert size >= batch and size in buckets
    assert all(b < batch for b in buckets if b < size)  # none smaller holds it
    assert size - batch < 16 if batch > 8 else size < 2 * batch  # padding: under 16 rows past 8, under half below


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 4000), st.integers(0, 500), st.integers(1, 4000)),
                min_size=1, max_size=40), st.integers(0, 30))
def test_padding_keeps_the_rows_and_pads_harmlessly(rows, extra):
    step = DecodeStep([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                      [7 * i for i in range(len(rows))], list(range(len(rows))), [r[3] for r in rows])
    size = len(rows) + extra
    ids, positions, new_slots, new_index, table_rows, lengths = step.padded(size, pad_index=9999, pad_row=77)
    assert all(len(column) == size for column in (ids, positions, new_slots, new_index, table_rows, lengths))
    n = len(rows)
    assert (ids[:n], positions[:n], new_slots[:n], new_index[:n], table_rows[:n], lengths[:n]) == (
        step.token_ids, step.positions, step.new_slots, step.new_index, step.rows, step.lengths)
    assert new_slots[n:] == [-1] * extra and lengths[n:] == [0] * extra
    assert new_index[n:] == [9999] * extra and table_rows[n:] == [77] * extra
    with pytest.raises(ValueError, match="does not fit"):
        step.padded(n - 1, 0, 0)
