"""Models on this machine: the default one and the GGUFs pulled from the hub (`forge pull | models | rm`)."""
