def main() -> None:
    raise SystemExit("forge: CLI not implemented yet")
