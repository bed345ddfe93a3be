"""Where a hash slot lives on a Redis Cluster, for `script_client` (which keeps one raw connection).

`slot_owner` asks the given nodes in turn for `CLUSTER SLOTS` on a short-lived connection and returns
the primary serving the slot, and every node the map names (primaries and replicas: where to ask next
time, should the configured startup nodes be gone, e.g. a startup node that died and was failed over).
`is_redirect` and `is_stale_node` read the error replies that say a call went to the wrong node, or to
a slot in motion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.redis.resp import ScriptReplyError, read_replies

Address = tuple[str, int]

_CLUSTER_SLOTS = b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n"
_STALE = ("MOVED ",)
_BUSY = ("ASK ", "TRYAGAIN", "CLUSTERDOWN")


def is_redirect(error: str) -> bool:
    """The call was refused because of where its slot is (or is going): send it again."""
    return error.startswith(_STALE + _BUSY) or "non local key" in error or "cluster is down" in error


def is_stale_node(error: str) -> bool:
    """The connection's node no longer serves the slot (MOVED; from a script that declared no key,
    "non local key"): redial to the owner."""
    return error.startswith(_STALE) or "non local key" in error


async def slot_owner(
    slot: int, nodes: Sequence[Address], hello: Sequence[bytes], ssl: bool
) -> tuple[Address, list[Address]]:
    """The primary serving `slot`, as the first of `nodes` that answers says, and every node its map
    names. `hello`: AUTH, sent first."""
    failures: list[str] = []
    for host, port in nodes:
        writer = None
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=ssl or None)
            writer.write(b"".join(hello) + _CLUSTER_SLOTS)
            *answers, slots = await read_replies(reader, len(hello) + 1)
            for answer in (*answers, slots):
                if isinstance(answer, ScriptReplyError):
                    raise answer
            found: Address | None = None
            known: list[Address] = []
            for start, end, *served in slots:
                for node in served:
                    address = node[0].decode() or host  # empty: the address we asked on
                    if address != "?" and (address, int(node[1])) not in known:  # "?": not known yet
                        known.append((address, int(node[1])))
                if start <= slot <= end and served[0][0] != b"?":
                    found = (served[0][0].decode() or host, int(served[0][1]))
            if found is not None:
                return found, known
            failures.append(f"{host}:{port}: slot {slot} is not served")
        except (OSError, ScriptReplyError, ValueError, TypeError) as exc:
            failures.append(f"{host}:{port}: {exc}")
        finally:
            if writer is not None:
                writer.close()
    raise ConnectionError(f"no Redis Cluster node told where slot {slot} is ({'; '.join(failures)})")
