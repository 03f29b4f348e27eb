"""downpourctl's config file of contexts, and how the coordinator and its
credentials are chosen (client/config.cc does the same for downpourctl):

  coordinator: the argument, else the context's (context=NAME), else
  $DOWNPOUR_COORDINATOR, else the config file's current context, else
  127.0.0.1:7070. TLS files: each argument, else the chosen context's. The
  bearer token: token_file, else $DOWNPOUR_TOKEN, else the context's
  token_file.
"""
import os

from .errors import DownpourError

DEFAULT_COORDINATOR = "127.0.0.1:7070"
_CONTEXT_KEYS = ("name", "coordinator", "tls_ca", "tls_cert", "tls_key", "token_file")


def default_config_path():
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:
        return os.path.join(xdg, "downpour", "config.yaml")
    home = os.environ.get("HOME")
    return os.path.join(home, ".config", "downpour", "config.yaml") if home else ""


def _unquote(value):
    value = value.strip()
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        value = value[1:-1]
    return value


def parse_config(text, path):
    """{"current_context": str, "contexts": [dict]} of the config file's text,
    the small YAML that `downpourctl config set-context` writes."""
    current, contexts, in_contexts = "", [], False
    for number, line in enumerate(text.split("\n"), 1):
        line = line.split("#", 1)[0]
        if not line.strip():
            continue

        def error(what):
            return DownpourError(f"{path}:{number}: {what}")

        indented = line[0] in " -"
        item = line.strip()
        starts_item = item.startswith("- ")
        if starts_item:
            item = item[2:]
        if ":" not in item:
            raise error("expected KEY: VALUE")
        key, value = item.split(":", 1)
        key, value = key.strip(), _unquote(value)
        if not indented:
            in_contexts = False
            if key == "current-context":
                current = value
            elif key == "contexts":
                in_contexts = True
            else:
                raise error(f"unknown key '{key}' (current-context, contexts)")
            continue
        if not in_contexts:
            raise error("an indented line outside contexts")
        if starts_item:
            contexts.append({})
        if not contexts:
            raise error("a context must begin with '- name: NAME'")
        if key not in _CONTEXT_KEYS:
            raise error(f"unknown context key '{key}' ({', '.join(_CONTEXT_KEYS)})")
        contexts[-1][key] = value
    for context in contexts:
        if not context.get("name"):
            raise DownpourError(f"{path}: a context has no name")
    return {"current_context": current, "contexts": contexts}


def load_config(path):
    """The config file at `path`; an absent file is an empty config."""
    if not path or not os.path.exists(path):
        return {"current_context": "", "contexts": []}
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise DownpourError(f"config file {path} cannot be read: {e.strerror}") from None
    return parse_config(text, path)


def _find(config, name):
    for context in config["contexts"]:
        if context.get("name") == name:
            return context
    return None


def resolve(coordinator, context_name, config_path):
    """(address, where it came from, the context chosen or None)."""
    config = load_config(config_path)
    if coordinator:
        return coordinator, "the coordinator argument", None
    if context_name:
        context = _find(config, context_name)
        if context is None:
            raise DownpourError(f"context={context_name}: no such context in the config file "
                                f"{config_path or '(none)'}")
        return context.get("coordinator", ""), f"context {context_name}", context
    env = os.environ.get("DOWNPOUR_COORDINATOR")
    if env:
        return env, "DOWNPOUR_COORDINATOR", None
    if config["current_context"]:
        # A misspelt current-context must not quietly mean the default address.
        context = _find(config, config["current_context"])
        if context is None:
            raise DownpourError(
                f"current-context {config['current_context']} is not among the contexts of "
                f"{config_path}; fix it with downpourctl config use-context")
        return context.get("coordinator", ""), f"context {context['name']}", context
    return DEFAULT_COORDINATOR, "the default", None


def check_address(address, source):
    """Raises unless `address` is HOST:PORT ([V6]:PORT)."""
    host, sep, port = address.rpartition(":")
    ok = bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
    if ok and host.startswith("["):
        ok = host.endswith("]") and len(host) > 2
    if not ok:
        where = "" if source == "the coordinator argument" else f" (from {source})"
        raise DownpourError(f"coordinator {address!r}{where} is not HOST:PORT")


def read_token(token_file, context):
    """The bearer token, or None."""
    path = token_file
    if not path:
        env = os.environ.get("DOWNPOUR_TOKEN")
        if env and env.strip():
            return env.strip()
        path = (context or {}).get("token_file", "")
    if not path:
        return None
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError:
        raise DownpourError(f"token file {path} cannot be read") from None
    if not token:
        raise DownpourError(f"token file {path} is empty")
    return token
