"""Run a function right after a module is first imported (a post-import hook).

The runner must not import TensorFlow or Keras for a script that does not use them, yet it must
act the moment the script does: apply TensorFlow options before the script's next statement, and
patch ``keras.Model.fit``. A finder at the front of ``sys.meta_path`` asks the other finders for
the module's spec and wraps the loader's ``exec_module``; nothing else about the import changes.
"""

import sys


class ImportWatcher:
    """Calls ``callbacks[name](module)`` after module ``name`` has been executed.

    Exceptions from a callback propagate into the importing code only when the callback raises
    them on purpose (``SystemExit`` when an option cannot be applied); callbacks catch the rest.
    """

    def __init__(self, callbacks):
        self._callbacks = dict(callbacks)

    def install(self):
        """Put the watcher first on ``sys.meta_path``; runs callbacks for modules already loaded."""
        for name in list(self._callbacks):
            module = sys.modules.get(name)
            if module is not None:
                self._fire(name, module)
        if self._callbacks and self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def watching(self, name):
        return name in self._callbacks

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._callbacks:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self._wrap(spec, fullname)
        return spec

    def invalidate_caches(self):
        pass

    def _wrap(self, spec, name):
        loader = spec.loader
        original = loader.exec_module
        watcher = self

        def exec_module(module):
            try:
                original(module)
            finally:
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
            if module.__name__ == name:
                watcher._fire(name, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            spec.loader = _Loader(loader, exec_module)

    def _fire(self, name, module):
        callback = self._callbacks.pop(name, None)
        if not self._callbacks:
            self.uninstall()
        if callback is not None:
            callback(module)


class _Loader:
    """Delegating loader for the rare loader that does not accept a new attribute."""

    def __init__(self, loader, exec_module):
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)
