"""Code that runs inside a job, in the user's own interpreter.

Stdlib only at import time; TensorFlow and Keras are imported when the user's script imports them
(or when an option needs them). Nothing here imports the rest of ``trayapp``: the job's Python
does not have Headroom installed. ``bootstrap.py`` is the entry script; it loads this folder under
a private package name so the user's own modules are never shadowed.
"""
