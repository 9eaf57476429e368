class WeightsError(Exception):
    """A model that cannot be loaded; the message is one line for the user."""
