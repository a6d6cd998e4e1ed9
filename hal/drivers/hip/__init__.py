"""``hip``: AMD GPUs through hip-python. Only registration and the availability probe exist so far;
the driver will mirror ``hal.drivers.cuda`` over ``hal.drivers.gpu``."""
