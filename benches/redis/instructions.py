"""Instructions Redis executes per delivery (claim + completion): idem's
scripts at several items per call beside the `idempotent` crate's two
scripts. Counted by callgrind on a redis-server run by `instructions`, so
the figures repeat from run to run whatever else the machine does.
"""
import glob
import os
import struct
import subprocess
import sys

import redis

port, out_dir, peer_scripts = int(sys.argv[1]), sys.argv[2], sys.argv[3]
scripts = os.path.join(os.path.dirname(__file__), '../../crates/stores/idem-redis/src/scripts')
r = redis.Redis(port=port)


def source(*names):
    return ''.join(open(os.path.join(scripts, n)).read() for n in names)


def instructions():
    """Instructions since the last zeroing."""
    subprocess.run(['callgrind_control', '-d'], capture_output=True, check=True)
    newest = max(glob.glob(os.path.join(out_dir, 'callgrind.out*')), key=os.path.getmtime)
    for line in open(newest):
        if line.startswith(('summary:', 'totals:')):
            return int(line.split()[1])
    raise SystemExit(f'no totals in {newest}')


def cost(sha, calls, args_of):
    """Mean instructions per EVALSHA of `sha`, `calls` of them."""
    subprocess.run(['callgrind_control', '-z'], capture_output=True, check=True)
    pipe = r.pipeline(transaction=False)
    replies = []
    for c in range(calls):
        pipe.evalsha(sha, *args_of(c))
        if len(pipe) >= 100:
            replies += pipe.execute()
    replies += pipe.execute()
    return instructions() / calls, replies


begin = r.script_load(source('time.lua', 'begin_first.lua', 'record.lua', 'begin.lua'))
complete = r.script_load(source('time.lua', 'complete.lua'))
print('idem: instructions per item (fresh keys; lease 60 s; a 2-byte outcome)')
for n in [1, 4, 16, 64]:
    calls = 4096 // n
    r.flushall()

    def keys(c):
        return [f'idem:{{bench:{c}-{i}}}:r' for i in range(n)]

    b, tokens = cost(begin, calls, lambda c: [n, *keys(c), b'1', b'60000', b'3660001', *[b''] * n])

    def completion(c):
        args = [b'600000', b'600001', b'1' * n]
        # A lone first claim answers with its token alone.
        for t in tokens[c][1:] if n > 1 else [tokens[c]]:
            args += [struct.pack('<q', t), b'ok']
        return [n, *keys(c), *args]

    c, done = cost(complete, calls, completion)
    assert all(d == ([1] * n if n > 1 else 1) for d in done), 'every completion took'
    print(f'  {n:2} items a call: begin {b / n:7.0f}, complete {c / n:7.0f}, a delivery {(b + c) / n:7.0f}')

# The peer's scripts, as its Valkey store calls them: one key each, its
# serialized entry (about 60 bytes) and token.
claim = r.script_load(open(os.path.join(peer_scripts, 'claim.lua')).read())
finish = r.script_load(open(os.path.join(peer_scripts, 'complete.lua')).read())
r.flushall()
entry = b'x' * 60
a, _ = cost(claim, 2000, lambda c: [1, f'peer-{c}', entry, b'1234567', b'600000'])
b, _ = cost(finish, 2000, lambda c: [1, f'peer-{c}', entry + b'ok', b'1234567', b'600000'])
print(f'idempotent 0.3.0 (Valkey store): claim {a:7.0f}, complete {b:7.0f}, a delivery {a + b:7.0f}')

# The raw baseline: one SET NX PX per key, pipelined.
r.flushall()
subprocess.run(['callgrind_control', '-z'], capture_output=True, check=True)
pipe = r.pipeline(transaction=False)
for c in range(4000):
    pipe.set(f'key:{c}', 'v', nx=True, px=60000)
    if len(pipe) >= 100:
        pipe.execute()
pipe.execute()
print(f'SET key v NX PX 60000, pipelined: {instructions() / 4000:7.0f} a key')
