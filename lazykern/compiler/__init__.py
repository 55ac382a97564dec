r"""lazykern's kernel compiler: the front end every compiled engine shares.

A formula (:mod:`lazykern.formulas`) is traced into an expression graph (:mod:`lazykern.compiler.trace`)
and differentiated symbolically on that graph (:mod:`lazykern.compiler.grad`); each device has one
target that turns the graph into code: C for CPUs (:mod:`lazykern.cpu`). A new device is a new
target of this front end, not a second compiler.
"""
