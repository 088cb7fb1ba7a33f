"""The `xlm-sidecar` command. `xlm-sidecar --budget 3G` is short for `xlm-sidecar serve --budget 3G`.

Exit codes: 0 done, 1 unexpected failure, 2 bad flags, 3 model cannot be loaded, 4 cannot listen,
5 the daemon could not be reached (client commands).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import grpc
from pydantic import ValidationError

from sidecar import __version__
from sidecar.lifecycle import usage_errors
from sidecar.errors import InvalidArgument, ModelLoadError
from sidecar.lifecycle.usage_errors import say_failure

EXIT_FAILURE, EXIT_USAGE, EXIT_MODEL, EXIT_LISTEN, EXIT_UNREACHABLE = 1, 2, 3, 4, 5
SUBCOMMANDS = ("serve", "chat", "ask", "status", "budget", "testmodels", "profile")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the daemon (the default command)")
    p.add_argument("--model", type=Path, help="GGUF model file (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--mmproj", type=Path, help="vision projector (mmproj GGUF) for the model: enables screenshot questions")
    p.add_argument("--no-vlmopt", dest="vlmopt", action="store_false", default=None,
                   help="keep the vision encoder loaded between images (default: load it per image, VLMOpt)")
    p.add_argument("--budget", help="VRAM the game grants: 512M, 3G, 3GiB, 2.5G, 0 = CPU only (default 0)")
    p.add_argument("--ram-budget", help="host memory the daemon may hold (KV cache, prefix cache, weights, the "
                   "process): 512M, 2G; it then serves fewer NPCs at once (default: no cap)")
    p.add_argument("--max-cpu-threads", type=int, help="most CPU threads per forward pass (the game needs cores too)")
    p.add_argument("--host", help="address to listen on, or several comma-separated, e.g. 127.0.0.1,::1 (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default 50551; 0 picks a free one)")
    p.add_argument("--ctx", type=int, help="context per conversation, in tokens (default 4096)")
    p.add_argument("--parallel", type=int, help="conversations decoded together, each with its own KV cache "
                   "(default 0: as many as an eighth of the memory holds, 4 to 16)")
    p.add_argument("--batch", type=int, help="most prompt tokens per forward pass (default 512)")
    p.add_argument("--threads", type=int, help="CPU threads (default: one per physical core)")
    p.add_argument("--flash-attention", choices=("auto", "on", "off"))
    p.add_argument("--profile", help='machine profile the planner uses: auto (measure once, default), off, or a file')
    p.add_argument("--hardware", help="plan for this machine description instead of the measured profile, as `plan "
                   "--hardware` takes it: a spec or profile JSON file, a preset, or key=value figures (what-if runs, tests)")
    p.add_argument("--no-frame-guard", dest="frame_guard", action="store_false", default=None,
                   help="do not adapt to the game's frames (threads, pass sizes, pauses, priority): take the cores the plan gives")
    p.add_argument("--frame-guard-priority", choices=("auto", "idle", "low"), help="how far below the game the guard "
                   "puts the daemon's threads: auto (default: nice 19, and the idle scheduling class once the game fills "
                   "every core or its frames run late), idle (the idle class from the start) or low (nice 19 only)")
    p.add_argument("--frame-budget-ms", type=float, help="the game's frame budget when its frame reports do not say it "
                   "(default 16.7: 60 fps)")
    p.add_argument("--no-adaptive-threads", dest="adaptive_threads", action="store_false", default=None,
                   help="keep every pass at its planned threads even on a busy CPU (reproducible greedy text)")
    p.add_argument("--no-jump-forward", dest="jump_forward", action="store_false", default=None,
                   help="decode text a grammar forces token by token instead of in one pass (tool calls, JSON)")
    p.add_argument("--no-memory", dest="memory", action="store_false", default=None,
                   help="drop turns that leave a session's context instead of keeping them as memories, and recall nothing")
    p.add_argument("--embedding-model", metavar="FILE.gguf|auto|words",
                   help="what embeds NPC memories (default auto: all-MiniLM-L6-v2 from its PyPI package, else words)")
    p.add_argument("--device", help="ggml device to place onto, e.g. CUDA0, Vulkan0, RPC0 (default: the first GPU-type one)")
    p.add_argument("--rpc", help="register ggml RPC servers (host:port, comma-separated) as devices, like llama.cpp's --rpc")
    p.add_argument("--max-sessions", type=int, help="most NPC sessions kept at once (default 64)")
    p.add_argument("--prefix-cache-mb", type=int,
                   help="host memory for prompt prefixes shared across conversations, MiB (default 256; 0 = off)")
    p.add_argument("--max-prompt-tokens", type=int, help="longest prompt accepted, in tokens (default: three quarters of --ctx)")
    p.add_argument("--max-tokens-per-request", type=int, help="largest max_tokens accepted (default 2048)")
    p.add_argument("--max-message-bytes", type=int, help="largest gRPC message (default 8 MiB)")
    p.add_argument("--stream-interval-ms", type=float, help="least time between two chunks of a stream (default 33: 30 updates a second)")
    # Transports, auth and lifecycle (sidecar.service.transports, sidecar.lifecycle).
    p.add_argument("--socket", type=Path, help="serve gRPC on this Unix socket (owner-only) instead of TCP")
    p.add_argument("--ws-port", type=int, help="WebSocket bridge port (default --port + 1; 0 picks a free one; -1 disables it)")
    p.add_argument("--no-websocket", dest="ws_port", action="store_const", const=-1, help="do not serve the WebSocket bridge")
    p.add_argument("--http-port", type=int, help="OpenAI-compatible HTTP API port (default --port + 2; 0 picks a free one; -1 disables it)")
    p.add_argument("--no-http", dest="http_port", action="store_const", const=-1, help="do not serve the OpenAI-compatible HTTP API")
    p.add_argument("--allow-remote", action="store_true", default=None, help="accept calls from other machines (a token is required)")
    p.add_argument("--no-auth", action="store_true", default=None, help="accept calls without a token (local development only)")
    p.add_argument("--strict-model-names", action="store_true", default=None,
                   help="HTTP API: answer 404 to a request naming another model (default: the served model answers any name)")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="a web origin (exact, e.g. http://localhost:8080) whose pages may call the HTTP API; repeatable")
    p.add_argument("--token-file", type=Path, help="write the token here, owner-only (default: the user's runtime folder); "
                   "the token is XLM_SIDECAR_TOKEN if the launcher sets it, else random per launch")
    p.add_argument("--parent-pid", type=int, help="exit when this process (the game) ends")
    p.add_argument("--grace-seconds", type=float, help="how long calls in flight may finish after SIGTERM/SIGINT (default 5)")
    p.add_argument("--max-image-bytes", type=int, help="largest image AskImage accepts (default 32 MiB)")
    # Remote mode (sidecar.remote): same API to the game, generation on an inference server.
    p.add_argument("--remote-url", help="forward generation to this OpenAI-compatible API (vLLM, llama.cpp's server), "
                   "e.g. http://10.0.0.5:8000/v1; no model is loaded here")
    p.add_argument("--remote-model", help="model name to ask the remote server for (default: the first it lists)")
    p.add_argument("--remote-api-key-env", metavar="VAR", help="environment variable that holds the remote server's API key")
    p.add_argument("--log-format", choices=("auto", "console", "json"))
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.set_defaults(run=_run_serve)


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None, help="daemon address (default 127.0.0.1:50551)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    p.add_argument("--token", default=None, help="the daemon's token (default: XLM_SIDECAR_TOKEN, else the daemon's token file)")
    p.add_argument("--token-file", type=Path, default=None, help="read the daemon's token from this file")


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="say something to a running daemon and print the reply as it streams")
    p.add_argument("text", help="what the user says")
    p.add_argument("--session", default="", help="session id: continue this NPC's conversation")
    p.add_argument("--system", default=None, help="system prompt (the NPC's persona)")
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json-schema", default="", help="JSON schema (text or @file) the reply must follow")
    p.add_argument("--stats", action="store_true", help="print usage and timings after the reply")
    _add_client_flags(p)
    p.set_defaults(run=_run_chat)


def _add_ask(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="ask a running daemon (started with --mmproj) about an image")
    p.add_argument("question", help="what to ask about the image")
    p.add_argument("--image", type=Path, default=None, help="PNG or JPEG file (leave out for a follow-up in --session)")
    p.add_argument("--session", default="", help="session id: follow-ups reuse the image's KV cache")
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--temperature", type=float, default=None)
    _add_client_flags(p)
    p.set_defaults(run=_run_ask)


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show a running daemon's model, budget, memory and sessions")
    p.add_argument("--json", action="store_true", help="print the status message as JSON")
    _add_client_flags(p)
    p.set_defaults(run=_run_status)


def _add_budget(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("budget", help="change a running daemon's budget (SetBudget), as the game does; "
                       "with no flag, show the one in force")
    p.add_argument("--vram", metavar="SIZE", help="VRAM the game grants: 512M, 3G, 0 = CPU only")
    p.add_argument("--threads", type=int, metavar="N", help="most CPU threads per pass; 0 removes the cap")
    p.add_argument("--ram", metavar="SIZE", help="host memory the daemon may hold: 512M, 2G; 0 removes the budget")
    _add_client_flags(p)
    p.set_defaults(run=_run_budget)


def _register_optional(sub: argparse._SubParsersAction) -> None:
    # Commands that live with their own subsystem register themselves; a subsystem missing from a
    # trimmed build (e.g. a frozen game bundle without the profiler) just lacks its command.
    import importlib

    for module in ("sidecar.sessions_cli", "sidecar.testmodels.cli", "sidecar.profiler.cli", "sidecar.planner.cli", "sidecar.bench_cli"):
        try:
            register = importlib.import_module(module).register
        except ImportError:
            continue
        register(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = usage_errors.Parser(
        prog="xlm-sidecar",
        description="Run a language model beside a game, inside the VRAM budget the game grants.",
    )
    parser.add_argument("--version", action="version", version=f"xlm-sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    _add_chat(sub)
    _add_ask(sub)
    _add_status(sub)
    _add_budget(sub)
    _register_optional(sub)
    return parser


def _run_serve(args: argparse.Namespace) -> int:
    from sidecar.lifecycle.serve import serve
    from sidecar.lifecycle.logs import configure_logging
    from sidecar.service.grpc_server import PortInUse
    from sidecar.settings import Settings

    flags = {
        name: value
        for name, value in vars(args).items()
        if value is not None and name in Settings.model_fields
    }
    try:
        settings = Settings(**flags)
    except ValidationError as e:
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"]) or "settings"
            say_failure(f"xlm-sidecar: --{where.replace('_', '-')}: {err['msg']}")
        return EXIT_USAGE
    configure_logging(settings.log_format, settings.log_level)
    from sidecar.lifecycle.crash_file import write_stacks_on_crash

    write_stacks_on_crash()
    try:
        asyncio.run(serve(settings))
    except ModelLoadError as e:
        say_failure(f"xlm-sidecar: {e}")
        return EXIT_MODEL
    except PortInUse as e:
        say_failure(f"xlm-sidecar: {e} (is another daemon running? use --port)")
        return EXIT_LISTEN
    except InvalidArgument as e:
        say_failure(f"xlm-sidecar: {e}")
        return EXIT_USAGE
    return 0


def _client(args: argparse.Namespace):
    from sidecar.client import DEFAULT_ADDRESS, SidecarClient

    return SidecarClient(args.address or DEFAULT_ADDRESS, timeout_s=args.timeout, token=args.token, token_file=args.token_file)


def _rpc_failure(e: grpc.RpcError, address: str) -> int:
    if e.code() == grpc.StatusCode.UNAVAILABLE:
        print(f"xlm-sidecar: no daemon answers at {address} ({e.details()}); start one with `xlm-sidecar serve`", file=sys.stderr)
        return EXIT_UNREACHABLE
    print(f"xlm-sidecar: {e.code().name}: {e.details()}", file=sys.stderr)
    return EXIT_FAILURE


def _run_chat(args: argparse.Namespace) -> int:
    from sidecar.api import pb
    from sidecar.client import Reply

    schema = args.json_schema
    if schema.startswith("@"):
        schema = Path(schema[1:]).read_text(encoding="utf-8")
    sampling = pb.SamplingParams()
    if args.temperature is not None:
        sampling.temperature = args.temperature
    if args.seed is not None:
        sampling.seed = args.seed
    reply = Reply()
    with _client(args) as client:
        try:
            for piece in client.chat(
                args.text,
                session_id=args.session,
                system=args.system,
                max_tokens=args.max_tokens,
                sampling=sampling,
                stop=args.stop,
                json_schema=schema,
                reply=reply,
            ):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except grpc.RpcError as e:
            print()
            return _rpc_failure(e, client.address)
    print()
    if args.stats and reply.final is not None:
        f = reply.final
        print(
            f"[{pb.FinishReason.Name(f.finish_reason)}] prompt {f.usage.prompt_tokens} tokens "
            f"({f.usage.cached_prompt_tokens} cached), reply {f.usage.completion_tokens} tokens, "
            f"first token {f.timings.time_to_first_token_ms:.0f} ms, {f.timings.decode_tokens_per_s:.1f} tokens/s",
            file=sys.stderr,
        )
    return 0


def _run_ask(args: argparse.Namespace) -> int:
    from sidecar.api import pb

    sampling = pb.SamplingParams()
    if args.temperature is not None:
        sampling.temperature = args.temperature
    image = args.image.read_bytes() if args.image is not None else None
    with _client(args) as client:
        try:
            reply = client.ask_image(args.question, image=image, session_id=args.session,
                                     max_tokens=args.max_tokens, sampling=sampling)
        except grpc.RpcError as e:
            return _rpc_failure(e, client.address)
    print(reply.text)
    if reply.final is not None and reply.final.HasField("image"):
        i = reply.final.image
        how = f"encoded in {i.encode_ms:.0f} ms" if i.encode_ms else "reused from the session"
        print(f"[image {i.original_width}x{i.original_height} -> {i.encoded_width}x{i.encoded_height}, "
              f"{i.image_tokens} tokens, {how}{', downscaled for the budget' if i.downscaled else ''}]", file=sys.stderr)
    return 0


def _run_status(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from sidecar.api import pb

    from sidecar.budget import format_size

    with _client(args) as client:
        try:
            status = client.status()
        except grpc.RpcError as e:
            return _rpc_failure(e, client.address)
    if args.json:
        print(json.dumps(MessageToDict(status, preserving_proto_field_name=True), indent=2))
        return 0
    m, t = status.model, status.throughput
    print(f"xlm-sidecar {status.version}, up {status.uptime_s:.0f} s, listening on {', '.join(status.listen_addresses)}")
    print(f"model     {m.name} ({m.architecture}, {m.parameters / 1e6:.0f}M parameters, {format_size(m.file_bytes)})")
    print(f"budget    VRAM {format_size(status.budget.vram_bytes)}, CPU threads {status.budget.max_cpu_threads or 'no cap'}")
    m = status.memory
    ram = f" of RAM budget {format_size(m.ram_budget_bytes)}" if m.ram_budget_bytes else ", no RAM budget"
    print(f"memory    resident {format_size(m.host_resident_bytes)}{ram}; KV cache {format_size(m.kv_cache_bytes)} used of "
          f"{format_size(m.kv_cache_held_bytes)} held ({m.kv_sequences} of at most {m.kv_sequences_max} sequences); "
          f"prefix cache {format_size(m.prefix_cache_bytes)}; evicted sessions {format_size(m.saved_sessions_bytes)}"
          + _vision_memory(m))
    print(
        f"work      {t.requests_served} requests, {t.tokens_generated} tokens generated, "
        f"{t.decode_tokens_per_s:.1f} tokens/s decode, {t.prefill_tokens_per_s:.1f} tokens/s prefill"
    )
    tiers = status.schedule.tiers
    if tiers:
        first = tiers[0]
        predicted = f", predicted {first.predicted_tokens_per_s:.0f} tokens/s" if first.predicted_tokens_per_s else ""
        print(f"schedule  one-token passes: {pb.Placement.Name(first.placement).removeprefix('PLACEMENT_').lower()}, "
              f"{first.threads} threads{predicted}; {len(tiers)} tiers; VRAM planned "
              f"{format_size(status.memory.planned_vram_bytes)}, used {format_size(status.memory.vram_used_bytes)}")
    v = status.vision
    if v.available:
        print(
            f"vision    {Path(v.projector_path).name} ({v.placement}{', VLMOpt' if v.vlmopt else ''}, flash attention "
            f"{'on' if v.flash_attention else 'off'}), {v.images_encoded} images, last encode {v.last_encode_ms:.0f} ms"
        )
    else:
        print("vision    off (start with --mmproj PROJECTOR.gguf)")
    pc = status.prefix_cache
    if pc.max_bytes:
        print(f"prefixes  {pc.entries} shared ({format_size(pc.bytes_held)} of {format_size(pc.max_bytes)}), "
              f"{pc.hits} hits saving {pc.tokens_saved} prompt tokens, {pc.misses} computed, {pc.waits} waited")
    print(f"sessions  {len(status.sessions)} of {status.limits.max_sessions}")
    for s in status.sessions:
        print(f"          {s.session_id}: {s.tokens} tokens")
    print(f"requests  {t.requests_active} in a sequence, {t.requests_queued} queued")
    for r in status.requests:
        state = pb.RequestState.Name(r.state).removeprefix("REQUEST_STATE_").lower().replace("_", " ")
        who = f"{r.request_id or '(no id)'}{f' ({r.session_id})' if r.session_id else ''}"
        print(f"          {who}: {state}, prompt {r.prompt_tokens_done}/{r.prompt_tokens}, "
              f"{r.tokens_generated} generated, {r.age_ms / 1000:.1f} s old")
    return 0


def _run_budget(args: argparse.Namespace) -> int:
    from sidecar.api import pb
    from sidecar.budget import format_size

    request = pb.SetBudgetRequest()
    if args.vram is not None:
        request.vram_size = args.vram
    if args.threads is not None:
        request.max_cpu_threads = args.threads
    if args.ram is not None:
        request.ram_size = args.ram
    with _client(args) as client:
        try:
            if args.vram is not None or args.threads is not None or args.ram is not None:
                answer = client.set_budget(request)
                print(f"in force  reloaded {'yes' if answer.reloaded else 'no'}, paused {answer.pause_ms:.0f} ms")
            status = client.status()
        except grpc.RpcError as e:
            return _rpc_failure(e, client.address)
    m = status.memory
    print(f"budget    VRAM {format_size(status.budget.vram_bytes)}, CPU threads {status.budget.max_cpu_threads or 'no cap'}, "
          f"RAM {format_size(m.ram_budget_bytes) if m.ram_budget_bytes else 'no budget'}")
    print(f"memory    KV {m.kv_sequences} of at most {m.kv_sequences_max} sequences ({format_size(m.kv_cache_held_bytes)} "
          f"held); prefix cache {format_size(m.prefix_cache_bytes)}; evicted sessions {format_size(m.saved_sessions_bytes)}"
          + _vision_memory(m))
    return 0


def _vision_memory(m) -> str:
    from sidecar.budget import format_size

    if not (m.vision_worker_bytes or m.vision_reserved_bytes):
        return ""
    kept = f" of {format_size(m.vision_reserved_bytes)} set aside" if m.vision_reserved_bytes else ""
    return f"; vision worker {format_size(m.vision_worker_bytes)}{kept}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `xlm-sidecar` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_vision-worker"]:  # the daemon's own vision encoder process (frozen builds)
        from sidecar.vision.encode_worker import main as vision_worker

        return vision_worker()
    if argv[:1] == ["_grammar-probe"]:  # the daemon's own grammar checker process (frozen builds)
        from sidecar.native.grammar_probe import main as grammar_probe

        return grammar_probe()
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "serve")  # `xlm-sidecar --budget 3G`
    # The daemon's usage errors go the way its log goes (JSON lines to a launcher); a client
    # command's go to a person.
    usage_errors.json_lines = argv[:1] == ["serve"] and usage_errors.logs_are_json(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
