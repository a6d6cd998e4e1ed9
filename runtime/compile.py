def compile(fn): return fn
