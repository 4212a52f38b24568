"""Smoke test: can two NIXL agents (UCX backend) READ one CPU tensor into another on this machine?"""
import os

os.environ.setdefault("UCX_NET_DEVICES", "lo")  # loopback only, as in probe.py
os.environ.setdefault("UCX_TLS", "self,sm,tcp")

import torch
from nixl._api import nixl_agent, nixl_agent_config

cfg = nixl_agent_config(backends=["UCX"])
a = nixl_agent("A", cfg)
b = nixl_agent("B", cfg)
print("plugins", a.get_plugin_list())
print("UCX mem types", a.get_backend_mem_types("UCX"))
src = torch.arange(4096, dtype=torch.float32)
dst = torch.zeros(4096, dtype=torch.float32)
a.register_memory(a.get_reg_descs([src]))
b.register_memory(b.get_reg_descs([dst]))
name = b.add_remote_agent(a.get_agent_metadata())
a.add_remote_agent(b.get_agent_metadata())
h = b.initialize_xfer("READ", b.get_xfer_descs([dst]), b.get_xfer_descs([src]), name, b"done")
st = b.transfer(h)
while st not in ("DONE", "ERR"):
    st = b.check_xfer_state(h)
print("state", st, "equal", bool(torch.equal(src, dst)))
