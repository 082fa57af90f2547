"""`forge serve | migrate | generate | chat | bench | synth | pull | models | rm`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from dataclasses import asdict

from app.config import Settings, serve_flags, settings_from_flags
from app.config import engine_flags as _engine_args
from app.models import commands as model_commands
from engine import BackendUnavailable, Engine, EngineOverloaded, GenerationRequest, InvalidRequest, SamplingParams
from engine.loader import ModelLoadError


def _sampling_args(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--system", default=None, help="system prompt (default: the template's own)")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge", description="Forge: streaming chat service and inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    serve_flags(sub.add_parser("serve", help="serve the chat UI, WebSocket/SSE, OpenAI-compatible API and admin page"))

    p = sub.add_parser("migrate", help="apply database migrations up to head")
    p.add_argument("--db", dest="database_url", default=None)

    p = sub.add_parser("generate", help="complete one prompt, streaming to the terminal")
    p.add_argument("prompt")
    p.add_argument("--raw", action="store_true", help="no chat template: the prompt is the model's input")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    _sampling_args(p, temperature=0.7)
    _engine_args(p)

    p = sub.add_parser("chat", help="interactive terminal chat (history reuses the KV cache)")
    _sampling_args(p, temperature=0.7)
    _engine_args(p)

    p = sub.add_parser("bench", help="benchmark the engine in-process (tokens/s, TTFT, ITL)")
    _engine_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--quick", action="store_true", help="smaller workloads (smoke run)")
    p.add_argument("--profile", action="store_true", help="also time every op of a single-stream decode step")

    p = sub.add_parser(
        "synth",
        help="write a GGUF with random weights of a given shape, for benchmarking",
        description="Write a GGUF file with random weights of a Llama shape: Forge and llama.cpp both "
        "load it, so both can be timed on the same bytes. It carries the default model's "
        "tokenizer and chat template, so its vocabulary is 49152 tokens whatever the shape "
        "says (--vocab-size pads it). The text it generates means nothing; only speed and memory are real.",
    )
    shape = p.add_mutually_exclusive_group(required=True)
    shape.add_argument("--shape", help="a preset: smollm2-135m, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b")
    shape.add_argument("--config", help="a HF config.json (LlamaForCausalLM fields)")
    p.add_argument("--quant", default="q4_0", help="q4_0 (default), q4_1, q8_0, q4_k, q6_k or f16")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="pad the tokenizer's ids with unused tokens up to this many, so the embedding and output "
        "matrices have a real model's rows (e.g. 128256 for Llama 3 shapes)",
    )
    model_commands.add_parsers(sub)  # pull, models, rm
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            from app.server import serve  # uvicorn and the app: only to serve

            serve(settings_from_flags(args))
        elif args.command == "migrate":
            from app.store.migrate import upgrade

            url = Settings.from_env(database_url=args.database_url).database_url
            upgrade(url)
            print(f"database at head: {url}")
        elif args.command == "bench":
            from engine.bench import run_bench

            run_bench(_load(args), as_json=args.json, quick=args.quick, profile=args.profile)
        elif args.command == "generate":
            asyncio.run(_generate(_load(args), args))
        elif args.command == "chat":
            asyncio.run(_chat(_load(args), args))
        elif args.command == "synth":
            _synth(args)
        elif args.command in ("pull", "models", "rm"):
            model_commands.run(args)
    except (ModelLoadError, BackendUnavailable, InvalidRequest, EngineOverloaded, ValueError) as exc:
        print(f"forge {args.command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def _synth(args: argparse.Namespace) -> None:
    from engine.loader.synth import preset, shape_from_config_file, write_synthetic

    shape = preset(args.shape) if args.shape else shape_from_config_file(args.config)
    r = write_synthetic(
        shape,
        args.quant,
        args.out,
        seed=args.seed,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        vocab_size=args.vocab_size,
    )
    print(
        f"wrote {r.path}: {shape.name} ({shape.layers} layers, hidden {shape.hidden}), {args.quant}, "
        f"{r.params / 1e9:.2f} B parameters, {r.file_bytes / 1e6:.0f} MB in {r.seconds:.1f} s"
    )


def _load(args: argparse.Namespace) -> Engine:
    return Engine.load(
        model=args.model or "default",
        backend=args.backend or "auto",
        kv_memory=args.kv_memory or "1GiB",
        threads=args.threads,
        quantize=args.quantize,
        activations=args.activations or "f32",
        speculative=args.speculative or "ngram",
        kv_spill_dir=args.kv_spill_dir or ("data/kv-spill" if args.kv_spill_size else None),
        kv_spill_size=args.kv_spill_size or ("2GiB" if args.kv_spill_dir else 0),
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=list(args.stop),
    )


def _messages(system: str | None, turns: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + turns


async def _generate(engine: Engine, args: argparse.Namespace) -> None:
    try:
        if args.raw:
            prompt_ids = engine.tokenizer.encode(args.prompt, add_special=False)
        else:
            prompt_ids = engine.render_chat(_messages(args.system, [{"role": "user", "content": args.prompt}]))
        text, token_ids, final = [], [], None
        async for ev in engine.generate(GenerationRequest(prompt_ids, _params(args))):
            text.append(ev.text)
            token_ids.extend(ev.token_ids)
            if not args.json and ev.text:
                print(ev.text, end="", flush=True)
            if ev.final:
                final = ev
        assert final is not None  # a generation always ends with a final event
        if final.finish_reason == "error":
            raise ValueError(final.error)
        if args.json:
            assert final.usage is not None and final.timings is not None  # every final event but an error's
            print(
                json.dumps(
                    {
                        "text": "".join(text),
                        "token_ids": token_ids,
                        "prompt_token_ids": prompt_ids,
                        "finish_reason": final.finish_reason,
                        "usage": asdict(final.usage),
                        "timings": asdict(final.timings),
                    },
                    ensure_ascii=False,
                )
            )
        else:
            print()
    finally:
        await engine.shutdown()


async def _chat(engine: Engine, args: argparse.Namespace) -> None:
    print(f"forge chat on {engine.model_info['name']} — /reset clears the history, /exit or Ctrl-D quits")
    turns: list[dict] = []
    try:
        while True:
            try:
                line = await asyncio.to_thread(input, "\n› ")
            except EOFError:
                break
            line = line.strip()
            if line in ("/exit", "/quit"):
                break
            if line == "/reset":
                turns.clear()
                print("(history cleared)")
                continue
            if not line:
                continue
            turns.append({"role": "user", "content": line})
            reply, final = [], None
            try:
                prompt_ids = engine.render_chat(_messages(args.system, turns))
                async for ev in engine.generate(GenerationRequest(prompt_ids, _params(args))):
                    reply.append(ev.text)
                    print(ev.text, end="", flush=True)
                    final = ev if ev.final else final
            except (InvalidRequest, EngineOverloaded, ValueError) as exc:  # e.g. the history outgrew the context
                turns.pop()
                print(f"(not sent: {exc}; /reset starts over)", file=sys.stderr)
                continue
            turns.append({"role": "assistant", "content": "".join(reply)})
            assert final is not None and final.usage is not None and final.timings is not None  # see _generate
            u, t = final.usage, final.timings
            print(
                f"\n[{u.completion_tokens} tokens, {u.cached_tokens}/{u.prompt_tokens} prompt tokens cached, "
                f"TTFT {t.ttft * 1000:.0f} ms]",
                file=sys.stderr,
            )
    finally:
        await engine.shutdown()


if __name__ == "__main__":
    main()
