"""Errors that mean "the input is wrong", as opposed to a bug.

The CLI turns an :class:`InputError` into one line on stderr and exit code 2.
"""


class InputError(Exception):
    """Bad user input: a malformed file, an unknown name, a missing index.

    The message names the file (or reference) and the problem on one line.
    """

    def __init__(self, source: str, problem: str):
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")

    def __reduce__(self):
        # Exception pickles as type(*self.args): one message, where __init__ takes two. A Ray
        # worker's InputError reaches the driver pickled, so rebuild it from what __init__ takes.
        return type(self), (self.source, self.problem), self.__dict__


class RequirementNotTrained(InputError):
    """A trial reads what a required trial keeps (a selector, an EAR trial's run) before that
    trial has finished: ``orchestrate run`` and ``sweep`` train it first."""
