"""ComfyUI's own client flow, as its script_examples/websockets_api_example.py
does it, with the `websocket-client` package: open the /ws progress stream,
POST /prompt with a prompt_id of the client's own, wait for the
`executing` message with `node: null` for the prompt, read
GET /history/{prompt_id}, and GET /view each output image.

One difference, documented for vacancyd: the example waits under the ID it
set, which vacancyd replaces; this client uses the prompt_id the reply
reports, and asks GET /history/<its own ID> once to record the answer.

Usage: comfy_ws_client.py HOST:PORT REQUEST.json, where the file holds
{"workflow": {...}, "asked": "ID"}.
Prints one JSON report on stdout; exits 1 with {"error": ...} when a step fails.
"""

import hashlib
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid

import websocket  # websocket-client

TIMEOUT_S = 120


def http(method, url, body=None):
    """(status, bytes) of one request; an HTTP error status is an answer too."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def handshake_status(url, origin):
    """The status of a WebSocket handshake sending `origin` (101 when it opens)."""
    ws = websocket.WebSocket()
    try:
        ws.connect(url, origin=origin, timeout=TIMEOUT_S)
        ws.close()
        return 101
    except websocket.WebSocketBadStatusException as e:
        return e.status_code


def main():
    server = sys.argv[1]
    with open(sys.argv[2], encoding="utf-8") as f:
        request = json.load(f)
    report = {"server": server}
    client_id = str(uuid.uuid4())
    ws_url = "ws://{}/ws?clientId={}".format(server, client_id)

    # websocket-client sends Origin: http://HOST:PORT, as a browser would.
    ws = websocket.WebSocket()
    try:
        ws.connect(ws_url, timeout=TIMEOUT_S)
    except websocket.WebSocketBadStatusException as e:
        report["error"] = "the /ws handshake answered {}".format(e.status_code)
        print(json.dumps(report))
        return 1
    report["ws_opened"] = True

    asked = request["asked"]
    status, body = http(
        "POST",
        "http://{}/prompt".format(server),
        {"prompt": request["workflow"], "client_id": client_id, "prompt_id": asked},
    )
    report["prompt_status"] = status
    if status != 200:
        report["error"] = "POST /prompt answered {}: {}".format(status, body.decode("utf-8", "replace"))
        print(json.dumps(report))
        return 1
    prompt_id = json.loads(body)["prompt_id"]
    report["prompt_id"] = prompt_id

    events = []
    while True:
        out = ws.recv()
        if not isinstance(out, str):
            continue  # previews are binary
        message = json.loads(out)
        data = message.get("data", {})
        if data.get("prompt_id") == prompt_id:
            events.append(message["type"])
        if message["type"] == "executing" and data.get("node") is None and data.get("prompt_id") == prompt_id:
            break  # execution is done
    ws.close()
    report["events"] = events

    status, body = http("GET", "http://{}/history/{}".format(server, prompt_id))
    report["history_status"] = status
    if status != 200:
        report["error"] = "GET /history answered {}".format(status)
        print(json.dumps(report))
        return 1
    entry = json.loads(body)[prompt_id]
    report["status_str"] = entry.get("status", {}).get("status_str")
    images = []
    for node_output in entry["outputs"].values():
        for image in node_output.get("images", []):
            query = urllib.parse.urlencode(
                {"filename": image["filename"], "subfolder": image["subfolder"], "type": image["type"]}
            )
            status, data = http("GET", "http://{}/view?{}".format(server, query))
            images.append(
                {
                    "filename": image["filename"],
                    "subfolder": image["subfolder"],
                    "type": image["type"],
                    "status": status,
                    "sha256": hashlib.sha256(data).hexdigest() if status == 200 else None,
                    "body": None if status == 200 else data.decode("utf-8", "replace"),
                }
            )
    report["images"] = images

    # The ID the client set: what a client waiting under it would ask.
    status, body = http("GET", "http://{}/history/{}".format(server, urllib.parse.quote(asked, safe="")))
    report["asked_history"] = {"status": status, "body": body.decode("utf-8", "replace")}

    # A page of another site opening the stream keeps its own Origin.
    report["foreign_origin_ws"] = handshake_status(ws_url, "http://elsewhere.example")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
