"""hear.py PORT SECONDS [--or-nothing]: accept one TCP connection on PORT
(any address) within SECONDS and print the line it sends. Without a
connection in time: exit status 1, or with --or-nothing print nothing and
exit 0. The guests' msg_recv and the host's ns_hear."""
import socket
import sys

port, t = int(sys.argv[1]), float(sys.argv[2])
or_nothing = "--or-nothing" in sys.argv[3:]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen(1)
s.settimeout(t)
try:
    c, _ = s.accept()
except socket.timeout:
    sys.exit(0 if or_nothing else 1)
c.settimeout(t)
data = b""
while not data.endswith(b"\n"):
    chunk = c.recv(4096)
    if not chunk:
        break
    data += chunk
print(data.decode().strip())
