"""Sign an interaction exactly as Slack does (v0 HMAC-SHA256 over `v0:<timestamp>:<body>`), and build the
block_actions payload Slack sends when someone clicks a button of a posted message."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import urlencode


def sign(secret: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": f"v0={digest}",
        "Content-Type": "application/x-www-form-urlencoded",
    }


def form_body(payload: dict[str, Any]) -> bytes:
    return urlencode({"payload": json.dumps(payload)}).encode()


def button(message: dict[str, Any], option: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The actions block and the button for `option` in a posted message."""
    for block in message["blocks"]:
        if block["type"] != "actions":
            continue
        for element in block["elements"]:
            if json.loads(element["value"])["option"] == option:
                return block, element
    raise AssertionError(f"no button for {option!r} in {message['blocks']}")


def click(message: dict[str, Any], option: str, *, user: str, response_url: str) -> dict[str, Any]:
    """The block_actions payload for `user` clicking the `option` button of `message`."""
    block, element = button(message, option)
    return {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": "T0TEAM"},
        "api_app_id": "A0APP",
        "token": "legacy-verification-token",
        "container": {
            "type": "message",
            "message_ts": message["ts"],
            "channel_id": message["channel"],
            "is_ephemeral": False,
        },
        "trigger_id": "1.2.3",
        "team": {"id": "T0TEAM", "domain": "inference"},
        "channel": {"id": message["channel"], "name": "decisions"},
        "message": {
            "type": "message",
            "ts": message["ts"],
            "text": message["text"],
            "blocks": message["blocks"],
        },
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [
            {
                "action_id": element["action_id"],
                "block_id": block["block_id"],
                "text": element["text"],
                "value": element["value"],
                "style": element.get("style"),
                "type": "button",
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }
