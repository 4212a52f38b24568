"""A policy that replays scripted turns: the bad inputs a real model produces, on demand."""

from dataclasses import dataclass, field


@dataclass
class Scripted:
    """Model outputs given as text, turn by turn: the bad inputs a real model produces."""

    tokenizer: object
    turns: list
    versions: list = field(default_factory=lambda: [0])

    async def __call__(self, prompt_ids, sampling, trajectory_id):
        text, stop = self.turns.pop(0)
        ids = self.tokenizer.encode(text)[: sampling.max_new_tokens]
        finish = "stop" if stop and len(ids) < sampling.max_new_tokens else "length"
        if finish == "stop":
            ids.append(self.tokenizer.eos_token_ids[0])
        return type("Out", (), {"output_ids": ids, "logprobs": [-1.0] * len(ids), "finish_reason": finish,
                                "weight_versions": self.versions * len(ids)})()
