"""Control patch for issue 37: a correct expand_batch_to_tokens inside every vLLM process.

Put this folder first on PYTHONPATH (scripts/vllm_selfdraft_live.py --fix-expand does) and
Python imports it at start-up in the API server and the engine core alike. When vLLM's
rejection sampler module is imported, its expand_batch_to_tokens is replaced by a plain
torch version (repeat_interleave) that keeps the input's dtype, so the acceptance test
divides by the request's own temperature. Nothing else of vLLM changes.
"""
import importlib.abc
import importlib.util
import sys

TARGET = "vllm.v1.sample.rejection_sampler"


def _expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    import torch
    # [batch] -> [num_tokens]: each request's value repeated once per draft token
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64,
                                                                          device=cu_num_tokens.device))
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.expand_batch_to_tokens = _expand

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hook())
