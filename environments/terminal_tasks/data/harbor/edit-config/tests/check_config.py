import configparser
import sys

cfg = configparser.ConfigParser()
try:
    cfg.read_string(open(sys.argv[1]).read())
except (OSError, configparser.Error):
    print(0)
    sys.exit(0)
expected_rest = {
    ("server", "host"): "0.0.0.0",
    ("server", "workers"): "4",
    ("database", "url"): "postgres://db.internal:5432/app",
    ("database", "pool_size"): "10",
}
if any(cfg.get(s, k, fallback=None) != v for (s, k), v in expected_rest.items()):
    print(0)
    sys.exit(0)
score = 0.0
score += 0.5 if cfg.get("server", "port", fallback=None) == "8080" else 0.0
score += 0.5 if cfg.get("server", "debug", fallback=None) == "false" else 0.0
print(score)
