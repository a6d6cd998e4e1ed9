"""Lowering an op graph to one HAL command buffer per eval, through the graph cache, stage by stage.

- ``key``: the pending graph behind an eval's targets in dependency order, and its topology key;
- ``plan``: backward graphs expanded, kernels scheduled (``fusion``, ``row_groups``, ``epilogues``),
  a buffer for every value;
- ``record``: one reusable command buffer binding every buffer through a ``hal.Slot`` (on CPU
  drivers, one dispatch of a program running the kernels, ``cpu_program``);
- ``execute``: the recording to run, its binding table and its prepared execution;
- ``evaluate``: an eval through the graph cache, the stages above in turn.
"""
