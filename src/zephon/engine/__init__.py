"""The engine: structured concurrency, channels, worker pools and shared memory.

Nothing here knows about datasets or operators: stages are coroutines, work is functions.

| module | owns |
| --- | --- |
| ``channel`` | Bounded channels between stages |
| ``janitor`` | Shared memory never outlives the process tree that made it |
| ``pool`` | The process pool a pipeline owns for CPU-heavy steps |
| ``raypool`` | A pool of Ray actors with the worker pool's interface: ``await run(stage, fn |
| ``runner`` | Running stages: structured concurrency for a pipeline |
| ``shm`` | Blocks to and from worker processes through shared memory: large buffers are not |
| ``stats`` | Per-stage counters: items in and out, time busy and time waiting |
| ``urgent`` | One helper thread that runs the most urgent of its waiting calls first |
"""
