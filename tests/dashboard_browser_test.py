#!/usr/bin/env python3
"""The live dashboard in a real browser (issue 29, item 5).

  dashboard_browser_test.py ENDURE_BIN ENDURE_TRAIN_BIN SOURCE_DIR ARTIFACT_DIR

Starts a 2-node job (`endure run`) whose rank 1 is held in a step and
killed by this test once the page shows the live status, opens
the controller's dashboard in headless Chromium as soon as the controller
listens (before any node has registered), and watches both the API and the
page's DOM:

- the incident appears in the page's timeline, with the cause and route
  /api/incidents gives it, within 2 s of /api/incidents first listing it
  (the page is live: open before the kill, never reloaded; the DOM is read
  over the DevTools protocol, on a pipe);
- the ETTR chart's canvas says it draws points (data-points > 0) and marks
  the incident (data-incidents > 0);
- the node table lists both nodes by their names in /api/nodes;
- a fresh load (a new tab of the same browser) shows the incident too, and
  its screenshot (DevTools' Page.captureScreenshot) is kept as
  ARTIFACT_DIR/dashboard.png.

Python 3 standard library only. Exit 0: passed; 1: failed; 77: skipped (no
/usr/bin/chromium, or $CHROMIUM).
"""
import base64
import fcntl
import html.parser
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from held_rank import hold_fault, held_rank_pid

CHROMIUM = os.environ.get('CHROMIUM', '/usr/bin/chromium')
KILL_STEP = 600       # rank 1 is held in this step, and killed once the page is open
LATENCY_S = 2.0       # the incident must be on the page this soon after the API has it
DEADLINE_S = 180      # for the job to reach the kill and record the incident


def log(*a):
    print('dashboard_browser_test:', *a, flush=True)


class Failed(Exception):
    pass


def check(ok, what):
    if not ok:
        raise Failed(what)
    log('ok:', what)


def get_json(base, path):
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return json.loads(r.read().decode())


class Dom(html.parser.HTMLParser):
    """The parts of a dashboard DOM the test reads: every element's text by
    id, the canvases' attributes, and the rows of each table (a row: its
    attributes and {data-col: text} of its cells)."""

    def __init__(self, text):
        super().__init__()
        self.text, self.canvas, self.tables = {}, {}, {}
        self._open = []     # ids of open elements with an id, collecting text
        self._table = None
        self._row = None
        self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == 'canvas' and 'id' in a:
            self.canvas[a['id']] = a
        if tag == 'table' and 'id' in a:
            self._table = self.tables.setdefault(a['id'], [])
        elif tag == 'tr' and self._table is not None:
            self._row = {'attrs': a, 'cells': {}}
            self._table.append(self._row)
        elif tag == 'td' and self._row is not None:
            self._cell = a.get('data-col', '')
            self._row['cells'][self._cell] = ''
        if 'id' in a and tag not in ('canvas', 'table', 'input', 'br', 'img', 'meta'):
            self._open.append((tag, a['id']))
            self.text[a['id']] = ''

    def handle_endtag(self, tag):
        if tag == 'table':
            self._table = None
        elif tag == 'tr':
            self._row = None
        elif tag == 'td':
            self._cell = None
        if self._open and self._open[-1][0] == tag:
            self._open.pop()

    def handle_data(self, data):
        for _, i in self._open:
            self.text[i] += data
        if self._row is not None and self._cell is not None:
            self._row['cells'][self._cell] += data


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe
    (--remote-debugging-pipe: JSON messages ended by NUL, commands on the
    child's fd 3, answers and events on its fd 4)."""

    def __init__(self, tmp, out):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds():  # in the child, before exec: the pipe ends onto fds 3 and 4
            a = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 20)
            b = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 20)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.close(a)
            os.close(b)

        self.proc = subprocess.Popen(
            [CHROMIUM, '--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run',
             '--remote-debugging-pipe', '--user-data-dir=' + os.path.join(tmp, 'chromium-live'),
             '--window-size=1400,1800', 'about:blank'],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=fds, close_fds=False, start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b''
        self._id = 0
        self.session = None
        self.errors = []  # the page's uncaught exceptions and console.error calls

    def _send(self, method, params=None, session=True):
        self._id += 1
        msg = {'id': self._id, 'method': method, 'params': params or {}}
        if session and self.session:
            msg['sessionId'] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b'\0')
        return self._id

    def call(self, method, params=None, session=True, timeout=30):
        want = self._send(method, params, session)
        end = time.monotonic() + timeout
        while True:
            while b'\0' in self._buf:
                raw, self._buf = self._buf.split(b'\0', 1)
                msg = json.loads(raw)
                self._note(msg)
                if msg.get('id') == want:
                    if 'error' in msg:
                        raise Failed('%s: %s' % (method, msg['error']))
                    return msg.get('result', {})
            left = end - time.monotonic()
            if left <= 0:
                raise Failed('Chromium did not answer %s within %d s' % (method, timeout))
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise Failed('Chromium closed its DevTools pipe (exited %s)' % self.proc.poll())
                self._buf += chunk

    def _note(self, msg):
        p = msg.get('params', {})
        if msg.get('method') == 'Runtime.exceptionThrown':
            d = p.get('exceptionDetails', {})
            self.errors.append('exception: %s %s' % (d.get('text'), d.get('exception', {}).get('description')))
        elif msg.get('method') == 'Runtime.consoleAPICalled' and p.get('type') == 'error':
            self.errors.append('console.error: %s' % [a.get('value', a.get('description'))
                                                      for a in p.get('args', [])])

    def open(self, url):
        target = self.call('Target.createTarget', {'url': 'about:blank'}, session=False)
        self.session = self.call('Target.attachToTarget',
                                 {'targetId': target['targetId'], 'flatten': True},
                                 session=False)['sessionId']
        self.call('Page.enable')
        self.call('Runtime.enable')
        self.call('Page.navigate', {'url': url})

    def eval(self, expression):
        r = self.call('Runtime.evaluate', {'expression': expression, 'returnByValue': True})
        return r.get('result', {}).get('value')

    def dom(self):
        return Dom(self.eval('document.documentElement.outerHTML') or '')

    def close(self):
        try:
            if self.proc.poll() is None:
                self.session = None
                self.call('Browser.close', session=False, timeout=5)
        except Exception:
            pass
        stop(self.proc, 'chromium (live)', signal.SIGTERM, 10)
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass


def stop(proc, what, sig, wait_s):
    """Stops `proc` (started in its own session) with `sig`, then its whole
    process group with SIGKILL if it has not ended within `wait_s`."""
    if proc is None:
        return
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            log(what, 'did not stop on signal', sig, '- SIGKILL to its process group')
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def incident_row(dom, incident_id):
    for row in dom.tables.get('incidents', []):
        if row['attrs'].get('data-incident-id') == str(incident_id):
            return row['cells']
    return None


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    endure, train, _source_dir, artifacts = sys.argv[1:]  # the source tree: not needed here
    if not os.access(CHROMIUM, os.X_OK):
        log('skipped:', CHROMIUM, 'is missing (Debian package chromium)')
        return 77
    os.makedirs(artifacts, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='endure_dashboard_test.')
    state = os.path.join(tmp, 'state')
    spec = os.path.join(tmp, 'dash.toml')
    # A small model, so that the job reaches the kill soon after the page
    # is open; far more steps than the test needs (it is stopped at the end).
    command = [train, '--steps', '100000', '--layers', '2', '--d-model', '64', '--context', '64',
               '--global-batch', '16', '--micro-batch', '8', '--threads', '1', '--log-every', '50',
               '--eval-batches', '1', '--sample-tokens', '16']
    with open(spec, 'w') as f:
        f.write('[job]\nname = "dashtest"\ncommand = %s\nnodes = 2\nranks_per_node = 1\n'
                'state_dir = %s\n[checkpoint]\nevery_steps = 1\npersist_every_steps = 20\n'
                '[recovery]\nrepair_delay = "1s"\nbackoff_initial = "0s"\n'
                % (json.dumps(command), json.dumps(state)))
        # Rank 1 is held in KILL_STEP, and killed by this test once the page
        # shows the live status: the incident comes after the page opened
        # however slow the browser's start or fast the job. One incident, the
        # kill: no rank is slow enough to be a straggler on a busy test
        # machine (the step times are still measured: they are the heatmap's).
        f.write(hold_fault('hold-%d' % KILL_STEP, 1, KILL_STEP).replace(
            '[detection]\n', '[detection]\nstraggler_min_excess = "1h"\n'))
    run = browser = None
    run_out = open(os.path.join(tmp, 'run.out'), 'w')
    chrome_out = open(os.path.join(tmp, 'chromium.out'), 'w')
    try:
        run = subprocess.Popen([endure, 'run', spec, '--quiet'], cwd=tmp, stdin=subprocess.DEVNULL,
                               stdout=run_out, stderr=subprocess.STDOUT, start_new_session=True)
        addr_file = os.path.join(state, 'http.addr')
        end = time.monotonic() + 60
        while not (os.path.exists(addr_file) and open(addr_file).read().strip()):
            if run.poll() is not None or time.monotonic() > end:
                raise Failed('no %s (endure run: %s)' % (addr_file, run.poll()))
            time.sleep(0.05)
        base = 'http://' + open(addr_file).read().strip()
        log('controller at', base)

        # The page is open before the job has a node, and stays open.
        browser = Browser(tmp, chrome_out)
        browser.open(base + '/')
        page_open_at = None
        api_at = dom_at = None
        incident = None
        killed = False
        others = set()
        end = time.monotonic() + DEADLINE_S
        while True:
            now = time.monotonic()
            if now > end:
                raise Failed('no incident on /api/incidents and the page within %d s (api: %s)'
                             % (DEADLINE_S, incident))
            if run.poll() is not None:
                raise Failed('endure run ended (%s) before the test was done' % run.poll())
            if page_open_at is None and browser.eval(
                    "document.getElementById('s-phase') && "
                    "document.getElementById('s-phase').textContent !== '–'"):
                page_open_at = time.monotonic()
                log('page shows the status after %.2f s' % (page_open_at - (end - DEADLINE_S)))
            if page_open_at is not None and not killed:
                pid = held_rank_pid(state, 1, KILL_STEP)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                    log('rank 1, held in step %d, killed (pid %d)' % (KILL_STEP, pid))
            if api_at is None:
                rows = get_json(base, '/api/incidents?page=0').get('rows', [])
                kills = [r for r in rows if r.get('rank') == 1 and 'SIGKILL' in str(r.get('cause'))]
                for r in rows:
                    if r not in kills and r.get('id') not in others:
                        others.add(r.get('id'))
                        log('note: an incident other than the kill:', r.get('id'), repr(r.get('cause')))
                if kills:
                    api_at = time.monotonic()
                    incident = kills[-1]
                    log('/api/incidents lists incident', incident.get('id'),
                        repr(incident.get('cause')), repr(incident.get('route')))
            if api_at is not None and dom_at is None:
                if browser.eval("!!document.querySelector('#incidents tr[data-incident-id=\"%s\"]')"
                                % int(incident['id'])):
                    dom_at = time.monotonic()
            if dom_at is not None:
                break
            time.sleep(0.05)

        check(page_open_at is not None and page_open_at < api_at,
              'the page was open and live before the incident was recorded')
        latency = dom_at - api_at
        check(latency <= LATENCY_S, 'the incident was on the page %.2f s after /api/incidents '
              'listed it (at most %.1f s)' % (latency, LATENCY_S))
        # The API's view of the incident and nodes, and the page's, once the
        # page has had a few refreshes (history is polled every 2 s).
        incident = next(r for r in get_json(base, '/api/incidents?page=0')['rows']
                        if r['id'] == incident['id'])
        nodes = get_json(base, '/api/nodes?page=0')['rows']
        names = sorted(r['name'] for r in nodes)
        check(len(names) == 2, '/api/nodes lists two nodes: %s' % names)

        def points(d, canvas, attr='data-points'):
            return int(d.canvas.get(canvas, {}).get(attr) or 0)

        def settled(d):
            listed = {r['cells'].get('name') for r in d.tables.get('nodes', [])}
            return all(points(d, c) > 0 for c in ('ettr-chart', 'ledger-chart', 'loss-chart', 'heatmap')) \
                and points(d, 'ettr-chart', 'data-incidents') > 0 and set(names) <= listed
        end = time.monotonic() + 15
        dom = browser.dom()
        while not settled(dom) and time.monotonic() < end:
            time.sleep(0.25)
            dom = browser.dom()
        with open(os.path.join(artifacts, 'dashboard_live.html'), 'w') as f:
            f.write(browser.eval('document.documentElement.outerHTML') or '')

        row = incident_row(dom, incident['id'])
        check(row is not None, 'the timeline has incident %s' % incident['id'])
        check(row.get('cause') == incident.get('cause'),
              'its cause on the page is /api/incidents\' %r (page: %r)'
              % (incident.get('cause'), row.get('cause')))
        check(row.get('route') == incident.get('route'),
              'its route on the page is /api/incidents\' %r (page: %r)'
              % (incident.get('route'), row.get('route')))
        check(row.get('node') == incident.get('node') and row.get('rank') == str(incident.get('rank')),
              'its node and rank are %r, %r' % (incident.get('node'), incident.get('rank')))
        check(points(dom, 'ettr-chart') > 0, 'the ETTR chart draws %d points' % points(dom, 'ettr-chart'))
        check(points(dom, 'ettr-chart', 'data-incidents') > 0,
              'the ETTR chart marks %d incident(s)' % points(dom, 'ettr-chart', 'data-incidents'))
        check(points(dom, 'ledger-chart') > 0 and points(dom, 'loss-chart') > 0,
              'the ledger and loss charts draw %d and %d points'
              % (points(dom, 'ledger-chart'), points(dom, 'loss-chart')))
        check(points(dom, 'heatmap') > 0, 'the step-time heatmap draws %d cells' % points(dom, 'heatmap'))
        listed = [r['cells'].get('name') for r in dom.tables.get('nodes', []) if r['cells']]
        check(set(names) <= set(listed), 'the node table lists both nodes by name: %s' % listed)
        check(dom.text.get('s-name') == 'dashtest', 'the header names the job: %r'
              % dom.text.get('s-name'))
        check(re.fullmatch(r'\d+\.\d%', dom.text.get('s-ettr', '')) is not None,
              'the header shows ETTR as a percentage: %r' % dom.text.get('s-ettr'))
        check(not browser.errors, 'the page threw nothing and logged no error (%s)'
              % '; '.join(browser.errors[:5]))

        # A fresh load, in a new tab of the same browser (a second Chromium
        # started cold on a busy core once took over 120 s): the page's first
        # refreshes show the incident; its screenshot is the artifact.
        shot = os.path.join(artifacts, 'dashboard.png')
        if os.path.exists(shot):
            os.remove(shot)
        browser.open(base + '/')
        opened = time.monotonic()
        row = None
        while row is None and time.monotonic() - opened < 60:
            row = incident_row(browser.dom(), incident['id'])
            if row is None:
                time.sleep(0.1)
        check(row is not None and row.get('cause') == incident.get('cause')
              and row.get('route') == incident.get('route'),
              'a fresh load shows incident %s (%r, %r) (after %.2f s)'
              % (incident['id'], incident.get('cause'), incident.get('route'),
                 time.monotonic() - opened))
        png = browser.call('Page.captureScreenshot', {'format': 'png'}, timeout=60).get('data', '')
        with open(shot, 'wb') as f:
            f.write(base64.b64decode(png))
        check(os.path.getsize(shot) > 10000, 'the screenshot is saved: %s' % shot)
        browser.close()
        browser = None
        log('PASSED')
        return 0
    except Failed as e:
        log('FAILED:', e)
        for name in ('run.out', 'chromium.out'):
            p = os.path.join(tmp, name)
            if os.path.exists(p):
                lines = [l for l in open(p, errors='replace').read().splitlines()
                         if 'dbus' not in l]  # Chromium's complaints about a missing D-Bus
                log('--- tail of', name)
                print('\n'.join(lines[-40:]), flush=True)
        return 1
    finally:
        if browser is not None:
            browser.close()
        # endure run stops its agents and workers on SIGINT.
        stop(run, 'endure run', signal.SIGINT, 30)
        run_out.close()
        chrome_out.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
