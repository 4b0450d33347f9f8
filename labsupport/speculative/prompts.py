"""The two prompts chapter 06 and ``python -m labsupport.bench speculative`` measure on.

``PROSE`` is ordinary text: a draft model helps, prompt lookup finds little to copy.
``REPETITIVE`` is JSON-like text whose next line repeats the shape of the previous ones:
prompt lookup (n-gram drafting) can copy long runs from it.
"""

PROSE = ("Return the number of items in the sequence. If the optional argument is given, the "
         "default value is used instead of")
REPETITIVE = ('{"id": 1, "name": "alpha", "type": "int", "default": 0},\n'
              '{"id": 2, "name": "beta", "type": "int", "default": 0},\n'
              '{"id": 3, "name": "gamma", "type": "int", "default": 0},\n'
              '{"id": 4, "name": "delta", "type": "int", "default": 0},\n'
              '{"id": 5, "name": "')
