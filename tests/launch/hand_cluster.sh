# tests/launch/hand_cluster.sh: sourced by the scripts that start a cluster by hand. Sets `cluster`, the
# "cluster" part of a TF_CONFIG for 1 chief, 2 ps and 2 workers on 127.0.0.1 ports free now.
read -r -a ports <<<"$(python3 -c '
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
cluster="{\"chief\": [\"127.0.0.1:${ports[0]}\"], \"ps\": [\"127.0.0.1:${ports[1]}\", \"127.0.0.1:${ports[2]}\"], \"worker\": [\"127.0.0.1:${ports[3]}\", \"127.0.0.1:${ports[4]}\"]}"
