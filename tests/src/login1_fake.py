"""A fake org.freedesktop.login1 on a private D-Bus bus, for vacancy's tests.

Usage: python login1_fake.py BUS_ADDRESS SESSIONS_JSON

It serves what `loginctl list-sessions` and `loginctl show-session` call:
Manager.ListSessions, Manager.GetSession, and org.freedesktop.DBus.Properties
Get/GetAll on each session object. SESSIONS_JSON is re-read on every call, so
a test changes the sessions by rewriting it (atomically). Its shape:

  {"sessions": [{"id": "1", "uid": 1000, "user": "owner", "seat": "seat0",
                 "tty": "tty2", "type": "wayland", "class": "user",
                 "remote": false, "active": true, "state": "active",
                 "idle": false,
                 "props": {"Active": ["s", "perhaps"]}}]}

`props` (optional) overrides or adds properties as [signature, value]: a way to
serve what a real logind never would. With `"silent": true` at the top level
the fake answers nothing (a hung logind). Every call is logged to stdout.
"""

import json
import sys

from jeepney import HeaderFields, MessageType
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import Message
from jeepney.wrappers import new_error, new_method_return

NAME = "org.freedesktop.login1"
ROOT = "/org/freedesktop/login1"
MANAGER = "org.freedesktop.login1.Manager"
SESSION = "org.freedesktop.login1.Session"
PROPERTIES = "org.freedesktop.DBus.Properties"
PREFIX = ROOT + "/session/_"


def session_path(sid):
    return PREFIX + sid.encode().hex()


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def properties(s):
    path = session_path(s["id"])
    user_path = ROOT + "/user/_" + str(s.get("uid", 1000)).encode().hex()
    seat = s.get("seat", "")
    seat_path = ROOT + "/seat/" + seat if seat else "/"
    props = {
        "Id": ("s", s["id"]),
        "User": ("(uo)", (s.get("uid", 1000), user_path)),
        "Name": ("s", s.get("user", "owner")),
        "Timestamp": ("t", 1700000000000000),
        "TimestampMonotonic": ("t", 1000000),
        "VTNr": ("u", s.get("vtnr", 0)),
        "Seat": ("(so)", (seat, seat_path)),
        "TTY": ("s", s.get("tty", "")),
        "Display": ("s", s.get("display", "")),
        "Remote": ("b", bool(s.get("remote", False))),
        "RemoteHost": ("s", s.get("remote_host", "")),
        "RemoteUser": ("s", ""),
        "Service": ("s", s.get("service", "")),
        "Desktop": ("s", ""),
        "Scope": ("s", "session-%s.scope" % s["id"]),
        "Leader": ("u", 4242),
        "Audit": ("u", 0),
        "Type": ("s", s.get("type", "tty")),
        "Class": ("s", s.get("class", "user")),
        "Active": ("b", bool(s.get("active", True))),
        "State": ("s", s.get("state", "active")),
        "IdleHint": ("b", bool(s.get("idle", False))),
        "IdleSinceHint": ("t", 0),
        "IdleSinceHintMonotonic": ("t", 0),
        "LockedHint": ("b", False),
    }
    for key, (sig, value) in s.get("props", {}).items():
        props[key] = (sig, tuple(value) if sig.startswith("(") else value)
    return path, props


def handle(msg, sessions_file):
    h = msg.header.fields
    path = h.get(HeaderFields.path)
    iface = h.get(HeaderFields.interface)
    member = h.get(HeaderFields.member)
    print("call", path, iface, member, msg.body, flush=True)
    state = load(sessions_file)
    if state.get("silent"):
        return None
    sessions = state.get("sessions", [])
    if path == ROOT and iface == MANAGER and member == "ListSessions":
        rows = []
        for s in sessions:
            rows.append(
                (s["id"], s.get("uid", 1000), s.get("user", "owner"),
                 s.get("seat", ""), session_path(s["id"]))
            )
        return new_method_return(msg, "a(susso)", (rows,))
    if path == ROOT and iface == MANAGER and member == "GetSession":
        for s in sessions:
            if s["id"] == msg.body[0]:
                return new_method_return(msg, "o", (session_path(s["id"]),))
        return new_error(msg, "org.freedesktop.login1.NoSuchSession", "s",
                         ("No session '%s' known" % msg.body[0],))
    if path and path.startswith(PREFIX) and iface == PROPERTIES:
        for s in sessions:
            spath, props = properties(s)
            if spath != path:
                continue
            if member == "GetAll" and msg.body[0] in ("", SESSION):
                return new_method_return(msg, "a{sv}", (props,))
            if member == "Get" and msg.body[0] in ("", SESSION):
                if msg.body[1] in props:
                    return new_method_return(msg, "v", (props[msg.body[1]],))
                return new_error(msg, "org.freedesktop.DBus.Error.UnknownProperty",
                                 "s", ("Unknown property",))
            if member == "GetAll":
                return new_method_return(msg, "a{sv}", ({},))
        return new_error(msg, "org.freedesktop.DBus.Error.UnknownObject", "s",
                         ("Unknown object '%s'." % path,))
    return new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod", "s",
                     ("Unknown method %s.%s" % (iface, member),))


def main():
    address, sessions_file = sys.argv[1], sys.argv[2]
    conn = open_dbus_connection(bus=address)
    reply = conn.send_and_get_reply(message_bus.RequestName(NAME, 4))
    if reply.body[0] != 1:
        print("could not own", NAME, reply.body, flush=True)
        sys.exit(1)
    print("ready", flush=True)
    while True:
        msg = conn.receive()
        if msg.header.message_type != MessageType.method_call:
            continue
        try:
            answer = handle(msg, sessions_file)
        except Exception as e:  # a test fixture: answer, log, keep serving
            print("error", repr(e), flush=True)
            answer = new_error(msg, "org.freedesktop.DBus.Error.Failed", "s", (repr(e),))
        if answer is None or msg.header.flags & 1:  # silent, or NO_REPLY_EXPECTED
            continue
        conn.send(answer)


if __name__ == "__main__":
    main()
