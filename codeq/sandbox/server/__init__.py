"""The trusted fork server that runs inside each warm sandbox (gVisor or the restricted host
subprocess). Standard library only: `codeq.sandbox.bundle` zips this package into one file that runs as
`python3 -S -I -B server.pyz CONFIG_JSON` (its `__main__` calls `serve.main`).

Protocol on stdin/stdout, every frame a 4-byte big-endian length then the body:
  server -> host  hello: JSON {"hello": {...capabilities}}
  host -> server  request: JSON {"program", "prelude", "runner", "calls", "call_timeout_s",
                  "wall_timeout_s"}, then a second frame with the run's 32-byte secret
  server -> host  reply: JSON result followed by a 32-byte HMAC-SHA256 of that JSON keyed
                  with the request's secret.

Children are forked ahead of time by the spawner, a process of the server's own that is forked
before the first request and so never sees a run's secret. A child closes every inherited
descriptor but its pipes, chroots into a jail holding only the Python standard library, sets
rlimits, drops to an unprivileged uid, and only then receives the program. The server enforces
the wall and per-call limits and reports the child's raw results; the spawner then kills every
process of that uid and wipes the run directory before the next run starts.
"""
