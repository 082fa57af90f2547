"""The one error every loading problem becomes."""


class ModelLoadError(Exception):
    """A model path, file or its contents cannot be loaded; the message names the problem."""
