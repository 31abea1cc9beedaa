"""An intruder with PyTorch's own store client, as in issue 12: it tries to join a running job by
the store's old key names (a rank announcing itself, the join counter) and to read what ranks
publish. Prints one line per attempt; exits 0 when every attempt was refused, 1 if any got in.

usage: store_intruder.py HOST PORT
"""
import sys
from datetime import timedelta

import torch.distributed as dist


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    got_in = False
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=3))
    except Exception as e:  # noqa: BLE001 - any refusal is what we want to see
        print(f"refused: connect: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return 0
    for name, attempt in [
        ("set rank key", lambda: store.set("ddp/rendezvous/rank/1", "1")),
        ("bump join count", lambda: store.add("ddp/rendezvous/count", 1)),
        ("read shm name", lambda: store.get("default_pg/ddp/shm/name")),
        ("list keys", lambda: store.num_keys()),
    ]:
        try:
            result = attempt()
            print(f"GOT IN: {name} -> {result!r}")
            got_in = True
        except Exception as e:  # noqa: BLE001
            print(f"refused: {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return 1 if got_in else 0


if __name__ == "__main__":
    sys.exit(main())
