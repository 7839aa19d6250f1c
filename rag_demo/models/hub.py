"""The Hugging Face Hub, or its absence: where the paper stack's weights come from.

Owns one decision: a Hub id becomes a local folder (the id itself if it is a folder, the local
HF cache next, a download only when the Hub answers a quick connect). huggingface_hub itself
retries for ~25 s when the Hub is down; we fail in at most a few seconds with a message that
says how to run offline.
"""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse


def hub_unavailable_reason(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub cannot be used now, or None if it looks reachable."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return "HF_HUB_OFFLINE is set"
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    result: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
            result.append(None)
        except OSError as e:
            result.append(f"{url.hostname} is unreachable ({e})")

    # The connect timeout does not cover the DNS lookup, which can hang far longer without a
    # network: probe in a daemon thread and give up on it after `timeout` seconds in all.
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout)
    return result[0] if result else f"{url.hostname} did not answer within {timeout:g} s"


def resolve_pretrained(name_or_path: str | Path, what: str) -> str:
    """A local folder for `name_or_path`: itself if it is one, else the Hub snapshot
    (the local HF cache first; a download only when the Hub is reachable)."""
    if Path(name_or_path).expanduser().exists():
        return str(Path(name_or_path).expanduser())
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(str(name_or_path), local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached: decide below whether a download can work
        pass
    reason = hub_unavailable_reason()
    if reason:
        raise ValueError(
            f"{what} {str(name_or_path)!r} is not in the local cache and {reason}: the paper stack needs the "
            "Hugging Face Hub (or its models already in the local HF cache). Run offline with --stack offline "
            "(the default), or download it once where there is network access and pass the local folder."
        )
    return snapshot_download(str(name_or_path))
