"""Namespaces of tpuemu.tf: a name not offered raises NotImplementedError."""


class NotOffered(NotImplementedError, AttributeError):
    """A TensorFlow name tpuemu.tf does not offer (also an AttributeError, so hasattr() says False)."""


def not_offered(name, why):
    def f(*args, **kwargs):
        raise NotOffered("%s is not offered by tpuemu.tf: %s" % (name, why))
    f.__name__ = name.rsplit(".", 1)[-1]
    f.__doc__ = "Not offered: " + why
    return f


class Namespace:
    """A module-like namespace (tf.keras.layers, ...)."""

    def __init__(self, name, **attrs):
        self.__dict__["_name"] = name
        self.__dict__["_why"] = {}
        self.__dict__.update(attrs)

    def _not(self, **why):
        self.__dict__["_why"].update(why)
        return self

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        why = self.__dict__["_why"].get(attr, "not emulated (docs/api: the TensorFlow names table lists "
                                                 "what is, with its C call)")
        raise NotOffered("%s.%s is not offered by tpuemu.tf: %s" % (self._name, attr, why))

    def __repr__(self):
        return "<namespace %s>" % self._name


class Offered:
    """A TensorFlow object's attributes: one it does not offer raises NotOffered."""

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise NotOffered("%s.%s is not offered by tpuemu.tf (docs/api/tensorflow-names.md lists what is, with "
                         "its C call)" % (type(self).__name__, attr))
