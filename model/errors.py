"""The errors the app reports in one line (the user can fix them), below every
module that raises them so that none has to import another to share them."""


class DeviceError(Exception):
    """A device, dtype or kernel-path request that cannot be met; one line for the user."""
