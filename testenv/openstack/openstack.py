"""Real OpenStack Keystone + Neutron API servers on loopback, backed by SQLite, for tests.

Run by the Python of the venv that testenv/openstack/build.sh prepares:

    openstack.py template --dir DIR   build the start state (databases, keys, users) once
    openstack.py serve [--dir DIR] [--keep] [--template DIR]
                                      copy the template, start Keystone and Neutron, print one
                                      JSON "ready" line, then obey line commands on stdin

Keystone and Neutron each run in a child process of their own: oslo.config keeps one global CONF
per process and parses sys.argv, so the two services cannot share a process. Each child serves its
WSGI application with cheroot (threaded, HTTP/1.1 keep-alive) and appends one JSON line per request
to <dir>/<service>-requests.log, which tests read to count what the service really received.

stdin commands (one reply line each, {"event": "<verb>-done", "service", "pid"} or
{"event": "error", "error": ...}):
    stop neutron | start neutron | kill neutron | stop keystone | start keystone | kill keystone
stdin EOF, SIGTERM, SIGINT or SIGHUP end both children and remove the directory (unless --keep).
"""

import os
import sys

# This file's directory is sys.path[0], and this file is named like openstacksdk's package
# `openstack`, which Neutron imports: keep the directory off the import path.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

import argparse  # noqa: E402
import json  # noqa: E402
import secrets  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
from http.client import HTTPException  # noqa: E402
import urllib.request  # noqa: E402

SCRIPT = os.path.abspath(__file__)
VENV = sys.prefix
BIN = os.path.join(VENV, "bin")
HOST = "127.0.0.1"
REGION = "RegionOne"
DOMAIN = "Default"
PROJECT = "wcm"
USERNAME = "wcm-network"
ADMIN = "admin"
SERVICE_PROJECT = "service"
SERVICE_USER = "neutron"
APP_CRED_NAME = "wcm-network"
# Exit status of a child that could not bind its port: the parent picks another port.
EXIT_ADDR_IN_USE = 98


def log(msg):
    print(f"openstack.py: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Configuration files (written into each state directory: they hold its absolute paths)
# ---------------------------------------------------------------------------------------------


def write_keystone_conf(d):
    path = os.path.join(d, "keystone.conf")
    with open(path, "w") as f:
        f.write(
            f"""[DEFAULT]
use_stderr = true
debug = false

[database]
connection = sqlite:///{d}/keystone.db

[token]
provider = fernet

[fernet_tokens]
key_repository = {d}/fernet-keys

[fernet_receipts]
key_repository = {d}/fernet-keys

[credential]
key_repository = {d}/credential-keys

[identity]
# bcrypt's minimum: every password check (each token for a password) costs ~1 ms instead of ~250 ms.
password_hash_rounds = 4

[cache]
# Without a cache every request re-reads roles and assignments (~200 queries, ~550 ms). One process
# owns this database, so an in-process cache stays consistent: Keystone invalidates it on writes.
enabled = true
backend = dogpile.cache.memory
"""
        )
    return path


def write_neutron_conf(d, secrets_, keystone_url):
    """neutron.conf + ml2_conf.ini. keystone_url is empty while the template is built (no auth)."""
    os.makedirs(os.path.join(d, "neutron-lock"), exist_ok=True)
    paste = os.path.join(VENV, "etc", "neutron", "api-paste.ini")
    auth = "noauth"
    authtoken = ""
    if keystone_url:
        auth = "keystone"
        authtoken = f"""
[keystone_authtoken]
www_authenticate_uri = {keystone_url}
auth_url = {keystone_url}
auth_type = password
username = {SERVICE_USER}
password = {secrets_["neutron_password"]}
project_name = {SERVICE_PROJECT}
user_domain_name = {DOMAIN}
project_domain_name = {DOMAIN}
region_name = {REGION}
service_token_roles_required = true
"""
    neutron = os.path.join(d, "neutron.conf")
    with open(neutron, "w") as f:
        f.write(
            f"""[DEFAULT]
use_stderr = true
debug = false
core_plugin = ml2
service_plugins =
auth_strategy = {auth}
api_paste_config = {paste}
rpc_workers = 0
rpc_state_report_workers = 0
transport_url = fake:/
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false

[database]
connection = sqlite:///{d}/neutron.db

[oslo_concurrency]
lock_path = {d}/neutron-lock
{authtoken}"""
        )
    ml2 = os.path.join(d, "ml2_conf.ini")
    with open(ml2, "w") as f:
        f.write(
            """[ml2]
type_drivers = local,flat,vlan,vxlan
project_network_types = local
mechanism_drivers =
extension_drivers = port_security
"""
        )
    return neutron, ml2


# ---------------------------------------------------------------------------------------------
# Children: one WSGI application each
# ---------------------------------------------------------------------------------------------


def die_with_parent(parent_pid):
    """The child gets SIGKILL when the process that started it dies (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception as e:  # not Linux: the parent still kills the process group
        log(f"prctl(PR_SET_PDEATHSIG) unavailable: {e}")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class RequestLog:
    """WSGI middleware: one JSON line per request, written before the response body is sent, so a
    client that has read a response finds its line in the file."""

    def __init__(self, app, path):
        import threading

        self.app = app
        self.path = path
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        started = time.time()
        t0 = time.monotonic()
        seen = {}

        def capture(status, headers, exc_info=None):
            seen["status"] = status
            return start_response(status, headers, exc_info)

        body = []
        try:
            it = self.app(environ, capture)
            try:
                body = list(it)
            finally:
                close = getattr(it, "close", None)
                if close:
                    close()
        finally:
            status = seen.get("status", "500")
            try:
                code = int(str(status).split()[0])
            except ValueError:
                code = 0
            record = {
                "ts": started,
                "method": environ.get("REQUEST_METHOD", ""),
                "path": environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""),
                "query": environ.get("QUERY_STRING", ""),
                "status": code,
                "ms": round((time.monotonic() - t0) * 1000.0, 3),
            }
            line = json.dumps(record) + "\n"
            with self.lock:
                with open(self.path, "a") as f:
                    f.write(line)
        return body


class SerializeWrites:
    """WSGI middleware: one mutating request at a time. SQLite lets one transaction write; two
    concurrent write transactions that began as readers fail at once with "database is locked"
    (SQLITE_BUSY, no busy wait), which Neutron turns into a 500. Reads stay concurrent."""

    def __init__(self, app):
        import threading

        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") in ("GET", "HEAD", "OPTIONS"):
            return self.app(environ, start_response)
        with self.lock:
            it = self.app(environ, start_response)
            try:
                return list(it)
            finally:
                close = getattr(it, "close", None)
                if close:
                    close()


def child_main(service, d, port, parent_pid):
    die_with_parent(parent_pid)
    # oslo.config reads sys.argv: the services must not see this script's arguments.
    sys.argv = [f"{service}-api"]
    if service == "keystone":
        os.environ["OS_KEYSTONE_CONFIG_DIR"] = d
        os.environ["OS_KEYSTONE_CONFIG_FILES"] = "keystone.conf"
        from keystone.wsgi.api import application
    elif service == "neutron":
        os.environ["OS_NEUTRON_CONFIG_DIR"] = d
        os.environ["OS_NEUTRON_CONFIG_FILES"] = "neutron.conf;ml2_conf.ini"
        from neutron.wsgi.api import application
    else:
        raise SystemExit(f"unknown service {service}")
    if application is None:
        raise SystemExit(f"{service}: the WSGI application did not load (see above)")

    from cheroot import wsgi as cheroot_wsgi

    app = RequestLog(SerializeWrites(application), os.path.join(d, f"{service}-requests.log"))
    server = cheroot_wsgi.Server((HOST, port), app, numthreads=8, request_queue_size=64, timeout=30)
    server.server_name = f"{service}-test"
    try:
        server.prepare()
    except OSError as e:
        log(f"{service}: cannot listen on {HOST}:{port}: {e}")
        os._exit(EXIT_ADDR_IN_USE)

    def on_term(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    log(f"{service}: serving on http://{HOST}:{port}")
    try:
        server.serve()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        try:
            server.stop()
        finally:
            # Library threads (oslo, keystonemiddleware) must not keep a stopped service alive.
            sys.stderr.flush()
            os._exit(0)


# ---------------------------------------------------------------------------------------------
# HTTP helpers (the parent stays light: urllib only)
# ---------------------------------------------------------------------------------------------


class HTTPStatus(Exception):
    def __init__(self, method, url, status, body):
        super().__init__(f"{method} {url}: {status} {body[:500]!r}")
        self.status = status


def http(method, url, body=None, token=None, timeout=10.0, expect=(200, 201, 202, 204)):
    data = None
    headers = {"Accept": "application/json"}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token:
        headers["X-Auth-Token"] = token
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status, hdrs = resp.status, resp.headers
    except urllib.error.HTTPError as e:
        raw = e.read()
        status, hdrs = e.code, e.headers
    if expect and status not in expect:
        raise HTTPStatus(method, url, status, raw.decode("utf-8", "replace"))
    parsed = json.loads(raw) if raw and raw[:1] in (b"{", b"[") else None
    return status, hdrs, parsed


def password_token(keystone_url, user, password, project):
    _, hdrs, _ = http(
        "POST",
        f"{keystone_url}/auth/tokens?nocatalog",
        {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {"user": {"name": user, "domain": {"name": DOMAIN}, "password": password}},
                },
                "scope": {"project": {"name": project, "domain": {"name": DOMAIN}}},
            }
        },
    )
    return hdrs["X-Subject-Token"]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Keystone content: projects, users, roles, application credential, catalog (idempotent)
# ---------------------------------------------------------------------------------------------


def ensure_keystone(keystone_url, neutron_url, creds):
    """Makes Keystone hold what the tests and Neutron need; creates only what is missing and points
    the catalog at this run's ports. Returns the wcm project id. Updates creds (app credential)."""
    k = keystone_url
    admin = password_token(k, ADMIN, creds["admin_password"], ADMIN)

    def one(collection, key, query):
        _, _, body = http("GET", f"{k}/{collection}?{query}", token=admin)
        items = body[key]
        return items[0] if items else None

    def ensure(collection, key, query, create):
        found = one(collection, key, query)
        if found:
            return found
        _, _, body = http("POST", f"{k}/{collection}", {key[:-1]: create}, token=admin)
        return body[key[:-1]]

    domain_id = "default"
    projects = {}
    for name, desc in ((PROJECT, "wasm-controller-manager tests"), (SERVICE_PROJECT, "service users")):
        projects[name] = ensure(
            "projects", "projects", f"name={name}&domain_id={domain_id}",
            {"name": name, "domain_id": domain_id, "description": desc},
        )
    roles = {}
    for name in ("member", "admin", "service", "reader"):
        roles[name] = ensure("roles", "roles", f"name={name}", {"name": name})
    users = {}
    for name, pw in ((USERNAME, creds["password"]), (SERVICE_USER, creds["neutron_password"])):
        users[name] = ensure(
            "users", "users", f"name={name}&domain_id={domain_id}",
            {"name": name, "domain_id": domain_id, "password": pw, "enabled": True},
        )
    grants = [
        (PROJECT, USERNAME, "member"),
        (SERVICE_PROJECT, SERVICE_USER, "admin"),
        (SERVICE_PROJECT, SERVICE_USER, "service"),
    ]
    for project, user, role in grants:
        http(
            "PUT",
            f"{k}/projects/{projects[project]['id']}/users/{users[user]['id']}/roles/{roles[role]['id']}",
            token=admin,
        )

    # Application credential of wcm-network (its secret is shown once: kept in credentials.json).
    uid = users[USERNAME]["id"]
    app_id = creds.get("application_credential_id")
    status = 404
    if app_id:
        status, _, _ = http("GET", f"{k}/users/{uid}/application_credentials/{app_id}", token=admin,
                            expect=(200, 404))
    if status != 200:
        user_token = password_token(k, USERNAME, creds["password"], PROJECT)
        _, _, body = http("GET", f"{k}/users/{uid}/application_credentials?name={APP_CRED_NAME}",
                          token=user_token)
        for old in body["application_credentials"]:
            http("DELETE", f"{k}/users/{uid}/application_credentials/{old['id']}", token=user_token)
        _, _, body = http(
            "POST", f"{k}/users/{uid}/application_credentials",
            {"application_credential": {"name": APP_CRED_NAME, "description": "wcm tests"}},
            token=user_token,
        )
        creds["application_credential_id"] = body["application_credential"]["id"]
        creds["application_credential_secret"] = body["application_credential"]["secret"]

    # Catalog: identity (made by bootstrap) and network, public + internal, in RegionOne.
    services = [("identity", "keystone", keystone_url), ("network", "neutron", neutron_url)]
    for stype, sname, url in services:
        svc = ensure("services", "services", f"type={stype}", {"type": stype, "name": sname, "enabled": True})
        _, _, body = http("GET", f"{k}/endpoints?service_id={svc['id']}", token=admin)
        by_interface = {e["interface"]: e for e in body["endpoints"]}
        for interface in ("public", "internal", "admin"):
            e = by_interface.get(interface)
            if e is None:
                if interface == "admin" and stype != "identity":
                    continue
                http("POST", f"{k}/endpoints",
                     {"endpoint": {"service_id": svc["id"], "interface": interface, "url": url,
                                   "region_id": REGION, "enabled": True}}, token=admin)
            elif e["url"] != url or e.get("region_id") != REGION:
                http("PATCH", f"{k}/endpoints/{e['id']}",
                     {"endpoint": {"url": url, "region_id": REGION}}, token=admin)
    return projects[PROJECT]["id"]


# ---------------------------------------------------------------------------------------------
# Supervision of the two children
# ---------------------------------------------------------------------------------------------


class Child:
    def __init__(self, service, d):
        self.service = service
        self.dir = d
        self.port = None
        self.proc = None
        self.logf = None

    @property
    def url(self):
        return f"http://{HOST}:{self.port}"

    def spawn(self):
        self.logf = open(os.path.join(self.dir, f"{self.service}.log"), "ab")
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, SCRIPT, "child", self.service, self.dir, str(self.port), str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=self.logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.dir,
            start_new_session=True,  # own process group: the whole group is signalled
        )

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, sig=signal.SIGTERM, grace=5.0):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal_group(sig)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.proc.wait()
        # Stragglers of the group (none expected) go too.
        self.signal_group(signal.SIGKILL)
        self.proc = None
        if self.logf:
            self.logf.close()
            self.logf = None

    def tail(self, n=30):
        try:
            with open(os.path.join(self.dir, f"{self.service}.log"), "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return ""


def wait_until(child, probe, timeout):
    """Polls probe() until it returns true; fails early when the child exits."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last = None
    while time.monotonic() < deadline:
        if not child.alive():
            code = child.proc.returncode if child.proc else None
            raise ChildExited(child.service, code, child.tail())
        try:
            if probe():
                return
        except (OSError, HTTPException, HTTPStatus, ValueError) as e:
            last = e
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
    raise RuntimeError(f"{child.service} did not answer within {timeout:.0f}s ({last}); log tail:\n{child.tail()}")


class ChildExited(Exception):
    def __init__(self, service, code, tail):
        super().__init__(f"{service} exited with status {code} before it answered; log tail:\n{tail}")
        self.code = code


def start_child(child, probe, timeout, fixed_port):
    """Starts child and waits for probe. Without a fixed port, a port lost to another process
    between choosing and binding it is replaced by a fresh one (a few tries)."""
    for attempt in range(5):
        if not fixed_port:
            child.port = free_port()
        child.spawn()
        try:
            wait_until(child, probe, timeout)
            return
        except ChildExited as e:
            child.stop()
            if e.code == EXIT_ADDR_IN_USE and not fixed_port and attempt < 4:
                log(f"{child.service}: port {child.port} was taken, trying another")
                continue
            raise


def keystone_probe(child):
    def probe():
        status, _, _ = http("GET", f"{child.url}/v3", timeout=2, expect=None)
        return status == 200

    return probe


class Stack:
    def __init__(self, d, template, keep):
        self.dir = d
        self.template = template
        self.keep = keep
        self.keystone = Child("keystone", d)
        self.neutron = Child("neutron", d)
        self.creds = None
        self.info = None
        self.token = None

    @property
    def keystone_url(self):
        return f"{self.keystone.url}/v3"

    def user_token(self):
        if self.token is None:
            self.token = password_token(self.keystone_url, USERNAME, self.creds["password"], PROJECT)
        return self.token

    def neutron_probe(self):
        def probe():
            if not self.keystone.alive():
                # Without Keystone, Neutron cannot check a token: any answer means it is up.
                status, _, _ = http("GET", f"{self.neutron.url}/", timeout=2, expect=None)
                return status > 0
            status, _, _ = http("GET", f"{self.neutron.url}/v2.0/networks", token=self.user_token(),
                                timeout=5, expect=None)
            if status == 401:
                self.token = None
            return status == 200

        return probe

    def start(self):
        t0 = time.monotonic()
        copy_state(self.template, self.dir)
        with open(os.path.join(self.dir, "credentials.json")) as f:
            self.creds = json.load(f)
        write_keystone_conf(self.dir)
        t_copy = time.monotonic()
        # Keystone first (Neutron's config names its port); Neutron's slow import overlaps with
        # Keystone's start and the Keystone bootstrap.
        self.keystone.port = free_port()
        self.neutron.port = free_port()
        while self.neutron.port == self.keystone.port:
            self.neutron.port = free_port()
        write_neutron_conf(self.dir, self.creds, self.keystone_url)
        self.keystone.spawn()
        self.neutron.spawn()
        try:
            wait_until(self.keystone, keystone_probe(self.keystone), 60)
        except ChildExited as e:
            if e.code != EXIT_ADDR_IN_USE:
                raise
            # Keystone's port was taken: Neutron's config must name the new one.
            self.keystone.stop()
            self.neutron.stop()
            start_child(self.keystone, keystone_probe(self.keystone), 60, fixed_port=False)
            write_neutron_conf(self.dir, self.creds, self.keystone_url)
            self.neutron.spawn()
        t_keystone = time.monotonic()
        project_id = ensure_keystone(self.keystone_url, self.neutron.url, self.creds)
        with open(os.path.join(self.dir, "credentials.json"), "w") as f:
            json.dump(self.creds, f)
        t_bootstrap = time.monotonic()
        try:
            wait_until(self.neutron, self.neutron_probe(), 90)
        except ChildExited as e:
            if e.code != EXIT_ADDR_IN_USE:
                raise
            self.neutron.stop()
            start_child(self.neutron, self.neutron_probe(), 90, fixed_port=False)
            ensure_keystone(self.keystone_url, self.neutron.url, self.creds)
        t_neutron = time.monotonic()
        log(
            f"ready in {t_neutron - t0:.1f}s (copy {t_copy - t0:.2f}s, keystone up {t_keystone - t0:.1f}s, "
            f"keystone bootstrap {t_bootstrap - t_keystone:.2f}s, neutron up {t_neutron - t0:.1f}s)"
        )
        d = self.dir
        self.info = {
            "event": "ready",
            "dir": d,
            "keystone_url": self.keystone_url,
            "neutron_url": self.neutron.url,
            "region": REGION,
            "project_id": project_id,
            "project_name": PROJECT,
            "user_domain_name": DOMAIN,
            "project_domain_name": DOMAIN,
            "username": USERNAME,
            "password": self.creds["password"],
            "application_credential_id": self.creds["application_credential_id"],
            "application_credential_secret": self.creds["application_credential_secret"],
            "admin_username": ADMIN,
            "admin_password": self.creds["admin_password"],
            "admin_project": ADMIN,
            "neutron_pid": self.neutron.proc.pid,
            "keystone_pid": self.keystone.proc.pid,
            "neutron_log": os.path.join(d, "neutron.log"),
            "keystone_log": os.path.join(d, "keystone.log"),
            "neutron_request_log": os.path.join(d, "neutron-requests.log"),
            "keystone_request_log": os.path.join(d, "keystone-requests.log"),
        }
        return self.info

    def command(self, line):
        words = line.split()
        if len(words) != 2 or words[1] not in ("neutron", "keystone"):
            raise ValueError(f"unknown command {line!r} (want stop|start|kill neutron|keystone)")
        verb, name = words
        child = self.neutron if name == "neutron" else self.keystone
        if verb == "stop":
            child.stop(signal.SIGTERM)
        elif verb == "kill":
            child.stop(signal.SIGKILL)
        elif verb == "start":
            if child.alive():
                raise ValueError(f"{name} is running")
            probe = self.neutron_probe() if name == "neutron" else keystone_probe(child)
            start_child(child, probe, 90, fixed_port=True)
        else:
            raise ValueError(f"unknown command {line!r} (want stop|start|kill neutron|keystone)")
        return {"event": f"{verb}-done", "service": name, "pid": child.proc.pid if child.alive() else None}

    def shutdown(self):
        self.neutron.stop(signal.SIGKILL)
        self.keystone.stop(signal.SIGKILL)
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def copy_state(template, d):
    """Copies the template's state files (databases, keys, credentials) into d."""
    if not os.path.isfile(os.path.join(template, "credentials.json")):
        raise RuntimeError(f"{template} is no template (no credentials.json); run testenv/openstack/build.sh")
    for name in os.listdir(template):
        src = os.path.join(template, name)
        dst = os.path.join(d, name)
        if name.endswith((".conf", ".ini", ".log")) or name == "neutron-lock":
            continue
        if os.path.isdir(src):
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
    # Fernet keys must stay private to their owner or Keystone refuses them.
    for sub in ("fernet-keys", "credential-keys"):
        p = os.path.join(d, sub)
        if os.path.isdir(p):
            os.chmod(p, 0o700)


def serve(args):
    template = os.path.abspath(args.template or os.path.join(VENV, "template"))
    if args.dir:
        d = os.path.abspath(args.dir)
        os.makedirs(d, exist_ok=True)
        if os.listdir(d):
            raise SystemExit(f"--dir {d} is not empty")
    else:
        d = tempfile.mkdtemp(prefix="wcm-openstack-")
    stack = Stack(d, template, args.keep)

    def on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        info = stack.start()
        out(info)
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                out(stack.command(line))
            except Exception as e:
                out({"event": "error", "error": str(e)})
    except SystemExit:
        pass
    except Exception as e:
        log(f"failed: {e}")
        stack.shutdown()
        return 1
    finally:
        # Ignore further signals while cleaning up so the cleanup itself is not cut short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.shutdown()
    return 0


def out(obj):
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise SystemExit(0)


# ---------------------------------------------------------------------------------------------
# Template: everything that does not depend on ports, built once per venv
# ---------------------------------------------------------------------------------------------


def run(label, cmd, **kw):
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{label} ({' '.join(cmd)}) failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    log(f"template: {label}: {time.monotonic() - t0:.1f}s")
    return r


NEUTRON_SCHEMA = """
import sys
import sqlalchemy
from neutron.db.migration.models import head
engine = sqlalchemy.create_engine(sys.argv[1])
head.get_metadata().create_all(engine)
engine.dispose()
"""


def in_background(fn):
    """Runs fn in a thread (the work is in subprocesses); join() re-raises its error."""
    import threading

    errors = []

    def body():
        try:
            fn()
        except BaseException as e:  # noqa: B036 - handed to the joining thread
            errors.append(e)

    t = threading.Thread(target=body)
    t.start()

    def join():
        t.join()
        if errors:
            raise errors[0]

    return join


def template(args):
    d = os.path.abspath(args.dir)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    t0 = time.monotonic()
    creds = {
        "admin_password": "admin-" + secrets.token_urlsafe(12),
        "password": "wcm-" + secrets.token_urlsafe(12),
        "neutron_password": "neutron-" + secrets.token_urlsafe(12),
    }
    for sub in ("fernet-keys", "credential-keys"):
        os.makedirs(os.path.join(d, sub), mode=0o700)
    kconf = write_keystone_conf(d)
    nconf, ml2 = write_neutron_conf(d, creds, "")
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    km = [os.path.join(BIN, "keystone-manage"), "--config-file", kconf]
    owner = ["--keystone-user", user, "--keystone-group", group]

    # Neutron's schema: create_all from the models, then stamp. Its migrations ALTER constraints,
    # which SQLite cannot do; Neutron's own unit tests build SQLite schemas the same way.
    def neutron_db():
        run("neutron schema (create_all)", [sys.executable, "-c", NEUTRON_SCHEMA, f"sqlite:///{d}/neutron.db"],
            cwd=d)
        run("neutron-db-manage stamp heads",
            [os.path.join(BIN, "neutron-db-manage"), "--config-file", nconf, "--config-file", ml2,
             "stamp", "heads"], cwd=d)

    def keystone_keys():
        run("keystone-manage fernet_setup", km + ["fernet_setup"] + owner, cwd=d)
        run("keystone-manage credential_setup", km + ["credential_setup"] + owner, cwd=d)

    join_neutron = in_background(neutron_db)
    join_keys = in_background(keystone_keys)
    try:
        run("keystone-manage db_sync", km + ["db_sync"], cwd=d)
        # URLs are placeholders: each run points the catalog at its own ports.
        placeholder = f"http://{HOST}:5000/v3"
        run("keystone-manage bootstrap",
            km + ["bootstrap", "--bootstrap-password", creds["admin_password"],
                  "--bootstrap-username", ADMIN, "--bootstrap-project-name", ADMIN,
                  "--bootstrap-role-name", "admin", "--bootstrap-service-name", "keystone",
                  "--bootstrap-region-id", REGION, "--bootstrap-admin-url", placeholder,
                  "--bootstrap-public-url", placeholder, "--bootstrap-internal-url", placeholder],
            cwd=d)
    finally:
        join_keys()
        join_neutron()

    # Users, projects, roles, the application credential and the catalog, through Keystone's API.
    t1 = time.monotonic()
    ks = Child("keystone", d)
    try:
        start_child(ks, keystone_probe(ks), 60, fixed_port=False)
        ensure_keystone(f"{ks.url}/v3", f"http://{HOST}:9696", creds)
    finally:
        ks.stop()
    log(f"template: keystone users, projects, catalog: {time.monotonic() - t1:.1f}s")
    with open(os.path.join(d, "credentials.json"), "w") as f:
        json.dump(creds, f)
    for name in os.listdir(d):
        if name.endswith((".conf", ".ini", ".log")) or name == "neutron-lock":
            p = os.path.join(d, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    log(f"template built in {time.monotonic() - t0:.1f}s")
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "child":
        _, _, service, d, port, parent = sys.argv
        child_main(service, d, int(port), int(parent))
        return 0
    p = argparse.ArgumentParser(prog="openstack.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("template", help="build the start state once")
    t.add_argument("--dir", required=True)
    s = sub.add_parser("serve", help="start Keystone + Neutron and obey stdin commands")
    s.add_argument("--dir", help="state directory (default: a new temporary directory)")
    s.add_argument("--keep", action="store_true", help="keep the state directory on exit")
    s.add_argument("--template", help="template directory (default: <venv>/template)")
    args = p.parse_args()
    if args.cmd == "template":
        return template(args)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
