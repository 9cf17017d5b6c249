"""The llama-server peer warmed from saved slots (`server-np16-restore`): each head prefilled
once into a slot of its own, saved to a file (`POST /slots/{id}?action=save`, which needs
`--slot-save-path`) and restored into every other slot (`?action=restore`), round robin over
the heads. llama.cpp's own way to put one prefill into many slots: the other -np 16 peer
prefills a head once per slot instead. Both then hold the same cells when the clock starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .peer_client import PeerClient, completion_payload

SAVE_FLAG = "--slot-save-path"


def slot_dir_of(extra_args: Sequence[str]) -> Path:
    """The --slot-save-path of a server's extra arguments."""
    args = list(extra_args)
    if SAVE_FLAG not in args or args.index(SAVE_FLAG) + 1 >= len(args):
        raise ValueError(f"no {SAVE_FLAG} in {args}")
    return Path(args[args.index(SAVE_FLAG) + 1])


def plan(heads: int, slots: int) -> list[tuple[int, int]]:
    """(slot, head) for every slot not holding its own prefill: slot s restores head s % heads.
    Slots 0 .. heads-1 prefill head s themselves."""
    if not 1 <= heads <= slots:
        raise ValueError(f"{heads} heads cannot each have a slot of {slots}")
    return [(s, s % heads) for s in range(heads, slots)]


def warm_by_restore(base_url: str, heads: Sequence[str], slots: int, slot_dir: Path) -> int:
    """Prefill each head into slot h, save it, restore it into the other slots; the saved
    files are deleted afterwards (the server reads them only while restoring; the folder is
    its owner's). Returns the slots restored."""
    client = PeerClient(base_url)
    files = [f"head-{h}.bin" for h in range(len(heads))]
    try:
        for h, text in enumerate(heads):
            payload = dict(completion_payload(text, 1), id_slot=h, stream=False)
            client.post_json("/completion", payload)
            client.post_json(f"/slots/{h}?action=save", {"filename": files[h]})
        pairs = plan(len(heads), slots)
        for slot, h in pairs:
            client.post_json(f"/slots/{slot}?action=restore", {"filename": files[h]})
        return len(pairs)
    finally:
        for name in files:
            (slot_dir / name).unlink(missing_ok=True)
