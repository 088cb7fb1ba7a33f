"""Time from launching `xlm-sidecar serve --budget 0` with an empty profile cache (XDG_CACHE_HOME=CACHE_DIR) to the
first token of a chat reply. Usage: .venv/bin/python bench/first_token.py CACHE_DIR [serve flags]; WAIT_S=150 keeps the
daemon up that long afterwards and prints its log events (the background profile landing)."""
import json, os, subprocess, sys, time, secrets
sys.path.insert(0, os.getcwd())
from sidecar.client import SidecarClient
cache = sys.argv[1]
tok = secrets.token_urlsafe(24)
env = {**os.environ, "XDG_CACHE_HOME": cache, "XLM_SIDECAR_TOKEN": tok}
extra = sys.argv[2:]
t0 = time.monotonic()
p = subprocess.Popen([".venv/bin/xlm-sidecar", "serve", "--budget", "0", "--port", "0", "--log-format", "json", *extra],
                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
addr = None
events = []
while True:
    line = p.stderr.readline()
    if not line:
        print("exited", p.wait(), events); sys.exit(1)
    try:
        e = json.loads(line)
    except ValueError:
        continue
    events.append((round(time.monotonic() - t0, 2), e.get("event")))
    if e.get("event") == "listening":
        addr = e["address"]; t_listen = time.monotonic() - t0
        break
first = None
with SidecarClient(addr, token=tok, timeout_s=120) as c:
    for piece in c.chat("Greetings, traveller! Who are you?", max_tokens=16):
        if first is None:
            first = time.monotonic() - t0
print(json.dumps({"listening_s": round(t_listen, 2), "first_token_s": round(first, 2)}))
import threading
def drain():
    for line in p.stderr:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        events.append((round(time.monotonic() - t0, 2), e.get("event"), {k: e[k] for k in ("tier_threads", "reason", "step", "path") if k in e}))
threading.Thread(target=drain, daemon=True).start()
wait = float(os.environ.get("WAIT_S", "0"))
time.sleep(wait)
p.terminate(); p.wait(20)
for ev in events:
    print(ev)
