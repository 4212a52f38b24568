"""Methods venusrl adds to each vLLM worker (`worker_extension_cls`), called through
`AsyncLLM.collective_rpc`. Runs inside vLLM's worker processes."""

from __future__ import annotations

import torch
from safetensors.torch import load_file


class VenusWorkerExtension:
    """Mixed into vLLM's worker class: `self` is the worker."""

    def venusrl_load_weights(self, path: str) -> int:
        """Load a trainer's state dict (Hugging Face names, as `save_pretrained` writes them),
        saved as safetensors at `path`, into the running model through vLLM's in-place reload:
        the model's `load_weights` (fusing q/k/v and gate/up as vLLM lays them out), then the
        weights processed again into the kernel layout (the CPU build repacks linear weights
        and empties the checkpoint-shaped parameters, so a plain `load_weights` fails). A file,
        not the tensors: vLLM's RPC to its workers turns tensor arguments into nested lists.
        Returns the number of tensors loaded."""
        state_dict = load_file(path)
        with torch.no_grad():
            self.reload_weights(weights_iterator=iter(state_dict.items()))  # type: ignore[attr-defined]
            self._retie_lm_head()
        return len(state_dict)

    def _retie_lm_head(self) -> None:
        """A tied lm_head loads no weights of its own, so vLLM 0.32's reload puts its old kernel
        tensors back (and warns "ParallelLMHead: Failed to load weights"): it would keep
        the old embedding. Tie it to the new one again and redo its kernel processing."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        hf_config = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
        lm_head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
        if not getattr(hf_config, "tie_word_embeddings", False) or lm_head is None or embed is None:
            return
        lm_head.weight = embed.weight
        lm_head.quant_method.process_weights_after_loading(lm_head)
