"""The cost model: terms, options, the stage accumulator, schedules, data parallel, the allocator."""
