"""Each running sequence's context slots in a device table, for kernels that read K/V from the
pool through it (SGLang's req_to_token).

Row r of `table` ([rows + 1, width], int64) holds, at column p, the pool slot of the token at
position p of the sequence assigned row r. The last row is scratch: padding rows of a CUDA
graph bucket point there (their writes land in it, their length is 0 so nothing reads it).

Invariants:
- a key keeps its row only while its request runs in consecutive forwards and the slots the
  row holds are still the start of its context; any other request is written afresh. The
  whole held prefix is compared, not a sample of it: the radix cache may swap a request's
  pages for identical ones another request computed (deduplication), anywhere in its context.
  The comparison is of lists whose ints are mostly the same objects as last step's, so it
  costs a pointer comparison per token;
- `prepare` writes every position before the new tokens; the new tokens' entries are written
  on the device by the forward itself (`new_index`), so a decode step needs no host write.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from venusrl.engine.attention.sequences import SequenceSlots


@dataclass(slots=True)
class _Row:
    row: int
    slots: list[int]  # what the row holds: the context of the previous forward


@dataclass(slots=True)
class TablePlan:
    """Where this forward's sequences sit in the table (batch order)."""

    rows: list[int]
    write_index: list[int]  # flat table index (row * width + position) of each write before the forward
    write_slots: list[int]
    new_index: list[int]  # flat table index of each new token, packed order


class SlotTable:
    def __init__(self, rows: int, width: int, device: torch.device):
        self.width = width
        self.num_rows = rows
        self.scratch_row = rows
        self.table = torch.zeros(rows + 1, width, dtype=torch.long, device=device)
        self._held: dict[str, _Row] = {}

    def prepare(self, sequences: list[SequenceSlots]) -> TablePlan:
        if len(sequences) > self.num_rows:
            raise ValueError(f"{len(sequences)} sequences in one forward; the slot table has {self.num_rows} rows "
                             "(engine.max_running_requests)")
        kept: dict[str, _Row] = {}
        for seq in sequences:
            held = self._held.get(seq.key)
            slots = seq.context_slots
            known = len(slots) - seq.num_new
            if held is not None and len(held.slots) <= known and slots[: len(held.slots)] == held.slots:
                kept[seq.key] = held
        free = sorted(set(range(self.num_rows)) - {h.row for h in kept.values()}, reverse=True)
        plan = TablePlan([], [], [], [])
        held_now: dict[str, _Row] = {}
        for seq in sequences:
            slots = seq.context_slots
            if len(slots) > self.width:
                raise ValueError(f"a context of {len(slots)} tokens; the slot table holds {self.width} "
                                 "(engine.kv_capacity_tokens or the model's max_position_embeddings)")
            entry = kept.get(seq.key)
            start = len(entry.slots) if entry is not None else 0
            row = entry.row if entry is not None else free.pop()
            base = row * self.width
            known = len(slots) - seq.num_new
            plan.write_index.extend(range(base + start, base + known))
            plan.write_slots.extend(slots[start:known])
            plan.new_index.extend(range(base + known, base + len(slots)))
            plan.rows.append(row)
            held_now[seq.key] = _Row(row, list(slots))  # a copy: the caller may change its list
        self._held = held_now  # a request absent from this forward gives its row up
        return plan

    @property
    def scratch_index(self) -> int:
        """A flat table index whose writes nothing reads (a padding row's new token)."""
        return self.scratch_row * self.width
