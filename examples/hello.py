# A sample for `gearbox run`: it runs in a fresh sandbox with no network and a private /work.
import os
import platform
import socket

print(f"hello from {platform.python_implementation()} {platform.python_version()}")
print(f"uid={os.getuid()} cwd={os.getcwd()} hostname={socket.gethostname()}")
print("visible at /:", sorted(os.listdir("/")))
# 127.0.0.1 is the sandbox's own loopback: the host's services are not there.
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1)
    print("reached a server on loopback")
except OSError as e:
    print("nothing listens on the sandbox's loopback:", e.strerror)
