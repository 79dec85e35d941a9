"""moto's S3 server with its conditional PUTs made atomic, as S3's are.

moto answers ``If-None-Match: *`` (and ``If-Match``) by looking the key up and then
storing the object, in a threaded HTTP server, without a lock: two PUTs racing for one
key can both pass the check and both succeed, the second replacing the first. S3 never
lets that happen, and the object-store sequencer depends on it (an entry number goes
to exactly one writer). The suite saw it once: a parent and its forked child both won
entry 81 of a log on moto, and the parent stopped at entry 82 with
:class:`~disklesslog.SequencerDamaged` (the chain check caught it; nothing was lost).

Run as ``python -m disklesslog.testing.servers.moto_s3 -H HOST -p PORT`` (moto's own
arguments): conditional PUTs run one at a time, everything else as moto does it.
"""

from __future__ import annotations

import threading
from typing import Any

from moto import server
from moto.s3.responses import S3Response

__all__ = ["main"]

_CONDITIONAL_PUTS = threading.Lock()


def _atomic_put_object(put_object: Any) -> Any:
    def put(self: S3Response) -> Any:
        if self.headers.get("If-None-Match") or self.headers.get("If-Match"):
            with _CONDITIONAL_PUTS:
                return put_object(self)
        return put_object(self)

    return put


def main() -> None:
    put_object = getattr(S3Response, "put_object", None)
    if put_object is None:  # a moto whose PUT handler moved: refuse rather than race
        raise SystemExit("moto_s3: this moto has no S3Response.put_object to make atomic")
    S3Response.put_object = _atomic_put_object(put_object)  # type: ignore[method-assign]
    server.main()


if __name__ == "__main__":
    main()
