"""deploy_consistency.py [--external NAME]... [--configs DIR] [--toml FILE] FILE...

Cross-resource checks kubernetes-validate cannot do (it validates one object at a time,
and the API schemas have almost no required fields): selectors, ports, ConfigMap and
Secret references, security context, probes, shutdown timing against gateway.toml,
ServiceMonitor/PodMonitor selectors and ports (the gateway's admin port), and
NetworkPolicies (they select a workload; a Redis one admits the Redis-backed gateways).
gateway.toml itself is validated by `dedup-gateway check`, not here. One rendering per run.
"""
import pathlib, re, sys, tomllib, yaml

errors = []


def err(msg):
    errors.append(msg)


def duration(text):
    """humantime subset -> seconds, or None."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+)\s*(ms|s|m|h)", text or "0s")
    if not parts or re.sub(r"(\d+)\s*(ms|s|m|h)|\s", "", text or "0s"):
        return None
    return sum(int(n) * units[u] for n, u in parts)


def check_toml(where, text):
    """Parse a gateway.toml for the deployment checks below. Returns the dict."""
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        err(f"{where}: not TOML: {e}")
        return None
    server = cfg.get("server", {})
    admin = server.get("admin_listen", "")
    if re.match(r"^(127\.|localhost:|\[::1\]:)", admin):
        err(f"{where}: server.admin_listen = {admin!r}: loopback, unreachable for probes")
    for key in ("shutdown_delay", "shutdown_grace", "header_timeout"):
        if key in server and duration(server[key]) is None:
            err(f"{where}: server.{key} = {server[key]!r}: not a duration")
    return cfg


def port_of(addr):
    return int(addr.rsplit(":", 1)[1]) if addr and ":" in addr else None


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def main(argv):
    external, configs_dir, files = set(), None, []
    it = iter(argv)
    for arg in it:
        if arg == "--external":
            external.add(next(it))
        elif arg == "--configs":
            configs_dir = pathlib.Path(next(it))
        elif arg == "--toml":
            path = next(it)
            check_toml(path, pathlib.Path(path).read_text())
        else:
            files.append(arg)
    docs = []
    for f in files:
        docs += [d for d in yaml.safe_load_all(pathlib.Path(f).read_text()) if d]
    if files and not docs:
        err("no resources rendered")
    seen = set()
    for d in docs:
        meta = d.get("metadata") or {}
        if not d.get("apiVersion") or not d.get("kind") or not meta.get("name"):
            err(f"resource without apiVersion/kind/metadata.name: {str(d)[:80]}")
            continue
        ident = (d["kind"], meta["name"])
        if ident in seen:
            err(f"duplicate {ident[0]}/{ident[1]}")
        seen.add(ident)
    by_kind = lambda kind: [d for d in docs if d.get("kind") == kind]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs if d.get("metadata")}
    configmaps = {d["metadata"]["name"]: d for d in by_kind("ConfigMap")}
    secrets = {d["metadata"]["name"]: d for d in by_kind("Secret")}
    services = by_kind("Service")
    workloads = [d for d in docs if d.get("kind") in ("Deployment", "StatefulSet")]
    # Workloads whose gateway uses Redis: the store's NetworkPolicy must admit them.
    redis_clients = []
    # The gateway container's ports and admin port, by workload (where its config is in
    # the rendering): a ServiceMonitor or PodMonitor must scrape exactly that port.
    gateway_admin = {}

    def need(kind, name, where):
        if name not in external and (kind, name) not in names:
            err(f"{where}: {kind} {name!r} is not in the rendering")

    for w in workloads:
        wn = f"{w['kind']}/{w['metadata']['name']}"
        spec = w.get("spec", {})
        tpl = spec.get("template", {})
        labels = tpl.get("metadata", {}).get("labels", {})
        if not matches(spec.get("selector", {}).get("matchLabels"), labels):
            err(f"{wn}: selector does not match the pod template's labels")
        pod = tpl.get("spec", {})
        psc = pod.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            err(f"{wn}: pod securityContext.runAsNonRoot must be true")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        volumes.update({t["metadata"]["name"]: {} for t in spec.get("volumeClaimTemplates", [])})
        for v in volumes.values():
            if "configMap" in v:
                need("ConfigMap", v["configMap"]["name"], f"{wn} volume {v['name']}")
            if "secret" in v and not v["secret"].get("optional"):
                need("Secret", v["secret"]["secretName"], f"{wn} volume {v['name']}")
        sidecars = [c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            cn = f"{wn} container {c['name']}"
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False:
                err(f"{cn}: allowPrivilegeEscalation must be false")
            if sc.get("readOnlyRootFilesystem") is not True:
                err(f"{cn}: readOnlyRootFilesystem must be true")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                err(f"{cn}: capabilities must drop ALL")
            seccomp = sc.get("seccompProfile") or psc.get("seccompProfile") or {}
            if seccomp.get("type") != "RuntimeDefault":
                err(f"{cn}: seccompProfile must be RuntimeDefault")
            res = c.get("resources", {})
            if not res.get("requests") or not res.get("limits", {}).get("memory"):
                err(f"{cn}: resources need requests and a memory limit")
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    err(f"{cn}: volumeMount {m['name']!r} has no volume")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    need("Secret", ref["secretKeyRef"]["name"], f"{cn} env {e['name']}")
                if "configMapKeyRef" in ref:
                    need("ConfigMap", ref["configMapKeyRef"]["name"], f"{cn} env {e['name']}")
            for src in c.get("envFrom", []):
                if "secretRef" in src:
                    need("Secret", src["secretRef"]["name"], f"{cn} envFrom")
                if "configMapRef" in src:
                    need("ConfigMap", src["configMapRef"]["name"], f"{cn} envFrom")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in ports:
                    err(f"{cn}: {probe} port {port!r} is not a port of this container")
            if "dedup-gateway" not in c.get("image", ""):
                continue
            # ---- the gateway container
            args = c.get("args", [])
            if "serve" not in args or "--config" not in args:
                err(f"{cn}: args must run `serve --config PATH`")
                continue
            cfg_path = args[args.index("--config") + 1]
            mount = next((m for m in c.get("volumeMounts", []) if cfg_path == m["mountPath"]
                          or cfg_path.startswith(m["mountPath"].rstrip("/") + "/")), None)
            if mount is None:
                err(f"{cn}: {cfg_path} is not under a volumeMount")
                continue
            if mount.get("subPath"):
                err(f"{cn}: config mounted with subPath: ConfigMap updates would never arrive")
            if c in pod.get("initContainers", []) and c not in sidecars:
                err(f"{cn}: a gateway init container must be a native sidecar (restartPolicy: Always)")
            for probe, path in (("startupProbe", None), ("livenessProbe", None), ("readinessProbe", "/readyz")):
                get = c.get(probe, {}).get("httpGet")
                if not get:
                    err(f"{cn}: {probe} (httpGet on the admin port) missing")
                elif path and get.get("path") != path:
                    err(f"{cn}: {probe} must use {path}")
                elif not path and get.get("path") not in ("/livez", "/healthz"):
                    err(f"{cn}: {probe} must use /livez or /healthz, never the store")
            vol = volumes.get(mount["name"], {})
            cm_name = vol.get("configMap", {}).get("name")
            if cm_name in external or cm_name is None:
                continue
            cm = configmaps.get(cm_name, {})
            key = mount.get("subPath") if cfg_path == mount["mountPath"] else \
                cfg_path[len(mount["mountPath"].rstrip("/")) + 1:]
            text = cm.get("data", {}).get(key)
            if text is None:
                err(f"{cn}: ConfigMap {cm_name!r} has no key {key!r}")
                continue
            cfg = check_toml(f"{cn} {cm_name}/{key}", text)
            if cfg is None:
                continue
            if configs_dir:
                configs_dir.mkdir(parents=True, exist_ok=True)
                (configs_dir / f"{w['metadata']['name']}-{cm_name}.toml").write_text(text)
            server, store = cfg.get("server", {}), cfg.get("store", {})
            listen, admin = port_of(server.get("listen")), port_of(server.get("admin_listen"))
            gateway_admin[id(w)] = (ports, admin)
            if listen not in ports.values():
                err(f"{cn}: server.listen port {listen} is not a containerPort")
            if admin is None or admin not in ports.values():
                err(f"{cn}: server.admin_listen port {admin} is not a containerPort")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if ports.get(port, port) != admin:
                    err(f"{cn}: {probe} must target the admin port {admin}")
            if store.get("backend", "memory") == "redis":
                redis_clients.append(w)
            replicas = spec.get("replicas", 1)
            if replicas > 1 and store.get("backend", "memory") != "redis":
                err(f"{wn}: {replicas} replicas need store.backend = \"redis\" (memory is per process)")
            drain = (duration(server.get("shutdown_delay", "0s")) or 0) + \
                (duration(server.get("shutdown_grace", "30s")) or 0)
            # After the grace: up to 2 s of releases, then 0.5 s for the 503s (README).
            if pod.get("terminationGracePeriodSeconds", 30) < drain + 3:
                err(f"{wn}: terminationGracePeriodSeconds must exceed shutdown_delay + shutdown_grace "
                    f"({drain:g}s) by 3s or more")
            env_names = {e["name"] for e in c.get("env", [])}
            env_from = [s["secretRef"]["name"] for s in c.get("envFrom", []) if "secretRef" in s]
            for s in env_from:
                env_names |= set(secrets.get(s, {}).get("stringData", {})) | set(secrets.get(s, {}).get("data", {}))
            for path, var in (("store.url_env", store.get("url_env")),
                              ("server.admin_token_env", server.get("admin_token_env"))):
                if var and var not in env_names and not (set(env_from) & external):
                    err(f"{cn}: {path} = {var!r} is not in the container's environment")
            routes = cfg.get("routes", [])
            for i, route in enumerate(routes):
                for k in ("secret_env", "aes_key_env"):
                    var = route.get(k)
                    if var and var not in env_names and not (set(env_from) & external):
                        err(f"{cn}: routes[{i}].{k} = {var!r} is not in the container's environment")

    for s in services:
        sn = f"Service/{s['metadata']['name']}"
        spec = s.get("spec", {})
        if spec.get("type") == "ExternalName":
            continue
        pods = [w for w in workloads
                if matches(spec.get("selector"), w["spec"]["template"]["metadata"].get("labels", {}))]
        if not pods:
            err(f"{sn}: selector {spec.get('selector')} matches no workload in the rendering")
        for p in spec.get("ports", []):
            target = p.get("targetPort", p.get("port"))
            for w in pods:
                pod = w["spec"]["template"]["spec"]
                if isinstance(target, str):
                    # Named target ports are resolved among the regular containers only.
                    ok = any(q.get("name") == target for c in pod.get("containers", []) for q in c.get("ports", []))
                else:
                    ok = any(q["containerPort"] == target for c in pod.get("containers", []) + pod.get("initContainers", [])
                             for q in c.get("ports", []))
                if not ok:
                    err(f"{sn}: targetPort {target!r} is not a port of {w['kind']}/{w['metadata']['name']}"
                        + (" (named ports of init/sidecar containers are not resolved)" if isinstance(target, str) else ""))

    for pdb in by_kind("PodDisruptionBudget"):
        sel = pdb.get("spec", {}).get("selector", {}).get("matchLabels")
        if not any(matches(sel, w["spec"]["template"]["metadata"].get("labels", {})) for w in workloads):
            err(f"PodDisruptionBudget/{pdb['metadata']['name']}: selector matches no workload")

    pod_labels = lambda w: w["spec"]["template"]["metadata"].get("labels", {})
    for np in by_kind("NetworkPolicy"):
        npn = f"NetworkPolicy/{np['metadata']['name']}"
        spec = np.get("spec", {})
        sel = spec.get("podSelector", {}).get("matchLabels") or {}
        protected = [w for w in workloads if all(pod_labels(w).get(k) == v for k, v in sel.items())]
        if not protected:
            err(f"{npn}: podSelector {sel} matches no workload in the rendering")
        if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
            continue

        def admits(labels):
            for rule in spec.get("ingress", []):
                peers = rule.get("from")
                if not peers:
                    return True
                for peer in peers:
                    if "namespaceSelector" in peer:
                        return True  # other namespaces: not decidable here
                    if "podSelector" in peer:
                        want = peer["podSelector"].get("matchLabels") or {}
                        if all(labels.get(k) == v for k, v in want.items()):
                            return True
            return False

        # Every Redis-backed gateway in the rendering reaches the store it protects.
        for w in redis_clients:
            if w not in protected and not admits(pod_labels(w)):
                err(f"{npn}: ingress admits no pod of {w['kind']}/{w['metadata']['name']}, "
                    f"a gateway with store.backend = \"redis\" (labels {pod_labels(w)})")

    def scrapes_admin(where, w, target):
        """`target` (a container port name or number) on workload `w` must be its
        gateway's admin port (/metrics lives there only)."""
        if id(w) not in gateway_admin:
            return  # no gateway config in the rendering (external ConfigMap)
        ports, admin = gateway_admin[id(w)]
        number = ports.get(target) if isinstance(target, str) else target
        if number != admin:
            err(f"{where}: scrapes port {target!r} of {w['kind']}/{w['metadata']['name']}, "
                f"not the gateway's admin port {admin} (/metrics)")

    def monitor_endpoints(name, spec, key, more_keys):
        """A ServiceMonitor's or PodMonitor's endpoints (under `key`), each scraping /metrics."""
        allowed = {"selector", key, "namespaceSelector"} | more_keys
        if set(spec) - allowed:
            err(f"{name}: unexpected spec keys {sorted(set(spec) - allowed)}")
        if not spec.get(key):
            err(f"{name}: no {key}")
        for ep in spec.get(key, []):
            if set(ep) - {"port", "path", "interval", "scrapeTimeout", "scheme"}:
                err(f"{name}: unexpected endpoint keys {sorted(ep)}")
            if ep.get("path", "/metrics") != "/metrics":
                err(f"{name}: endpoint path {ep.get('path')!r}: the gateway serves /metrics")
        return spec.get(key, [])

    for sm in by_kind("ServiceMonitor"):
        smn = f"ServiceMonitor/{sm['metadata']['name']}"
        spec = sm.get("spec", {})
        targets = [s for s in services if matches(spec.get("selector", {}).get("matchLabels"), s["metadata"].get("labels", {}))]
        if not targets:
            err(f"{smn}: selector matches no Service")
        for ep in monitor_endpoints(smn, spec, "endpoints", {"jobLabel"}):
            if not any(p.get("name") == ep.get("port") for s in targets for p in s["spec"].get("ports", [])):
                err(f"{smn}: endpoint port {ep.get('port')!r} is not a port of the selected Service")
            for s in targets:
                for p in s["spec"].get("ports", []):
                    if p.get("name") != ep.get("port"):
                        continue
                    for w in workloads:
                        if matches(s["spec"].get("selector"), pod_labels(w)):
                            scrapes_admin(f"{smn} (Service/{s['metadata']['name']})", w,
                                          p.get("targetPort", p.get("port")))

    for pm in by_kind("PodMonitor"):
        pmn = f"PodMonitor/{pm['metadata']['name']}"
        spec = pm.get("spec", {})
        pods = [w for w in workloads if matches(spec.get("selector", {}).get("matchLabels"), pod_labels(w))]
        if not pods:
            err(f"{pmn}: selector matches no workload's pods")
        for ep in monitor_endpoints(pmn, spec, "podMetricsEndpoints", {"jobLabel", "podTargetLabels"}):
            port = ep.get("port")
            if not isinstance(port, str):
                err(f"{pmn}: endpoint port must name a container port")
                continue
            for w in pods:
                pod = w["spec"]["template"]["spec"]
                # Prometheus's pod discovery lists init (native sidecar) containers too.
                if not any(q.get("name") == port for c in pod.get("containers", []) + pod.get("initContainers", [])
                           for q in c.get("ports", [])):
                    err(f"{pmn}: port {port!r} is not a port of {w['kind']}/{w['metadata']['name']}'s containers")
                else:
                    scrapes_admin(pmn, w, port)

    for e in errors:
        print(e)
    return 1 if errors else 0


sys.exit(main(sys.argv[1:]))
