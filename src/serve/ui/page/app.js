// The web view of subagents' runs: Live, Trees, Transcripts.
//
// Every piece of text from the server (labels, answers, tool arguments,
// failure reasons: written by models and agents, so hostile) goes into the
// page through text nodes only (`add`), never as HTML, and through `shown`,
// which turns control characters and bidi overrides into visible escapes.
// No attribute is ever set from that text but `title` (also through
// `shown`); there are no links made of it. The page talks only to its own
// server, with the token its address carries.
'use strict';

const TOKEN = new URLSearchParams(location.search).get('token') || '';
const ROW_HEIGHT = 26;
const PAGE_ROWS = 200;
const FOLD_AT = 2000;

// C0 and C1 controls but line feed and tab, and the bidi controls.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function shown(text) {
  return String(text ?? '').replace(HIDDEN, (c) => '\\u{' + c.codePointAt(0).toString(16).padStart(4, '0') + '}');
}

function add(parent, kid) {
  if (kid === null || kid === undefined || kid === false) return;
  parent.appendChild(kid instanceof Node ? kid : document.createTextNode(shown(kid)));
}

// An element: `props` may set only a class, a title and data attributes.
function el(tag, props, ...kids) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === 'class') node.className = value;
    else if (key === 'title') node.title = shown(value);
    else if (key === 'data') for (const [name, v] of Object.entries(value)) node.dataset[name] = shown(v);
    else if (key === 'onclick') node.addEventListener('click', value);
  }
  for (const kid of kids) add(node, kid);
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

const $ = (id) => document.getElementById(id);

async function api(path, params) {
  const query = new URLSearchParams(Object.assign({ token: TOKEN }, params || {}));
  const response = await fetch('/api/' + path + '?' + query.toString(), { cache: 'no-store' });
  if (!response.ok) {
    let why = response.statusText;
    try { why = (await response.json()).error || why; } catch (_) { /* not JSON */ }
    throw new Error(why);
  }
  return response.json();
}

function human(ms) {
  if (ms === null || ms === undefined) return '–';
  if (ms < 1000) return Math.round(ms) + ' ms';
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + ' s';
  const m = Math.floor(s / 60);
  if (m < 60) return m + ' min ' + Math.round(s % 60) + ' s';
  return Math.floor(m / 60) + ' h ' + (m % 60) + ' min';
}

// A server text: a string, or its cut form {text, left_out_bytes}.
function plain(value) {
  if (value === null || value === undefined) return '';
  return typeof value === 'string' ? value : String(value.text ?? '');
}

function count(n) {
  return n === null || n === undefined ? '–' : Number(n).toLocaleString('en');
}

function time(ms) {
  return ms ? new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '–';
}

function outcomeClass(outcome) {
  if (outcome === 'completed') return 'ok';
  if (outcome === 'running' || outcome === 'interrupted' || outcome === '') return 'neutral';
  return 'bad';
}

// A text, folded past FOLD_AT characters; `value` may be the server's cut
// form {text, left_out_bytes}.
function folded(value) {
  const text = typeof value === 'string' ? value : (value && value.text) || '';
  const leftOut = value && typeof value === 'object' ? value.left_out_bytes : 0;
  const box = el('div', { class: 'folded' });
  const pre = el('pre', {});
  box.appendChild(pre);
  const note = leftOut ? el('p', { class: 'note' }, '(' + count(leftOut) + ' more bytes not sent)') : null;
  if (text.length <= FOLD_AT) {
    add(pre, text);
    add(box, note);
    return box;
  }
  add(pre, text.slice(0, FOLD_AT));
  const more = el('button', { class: 'more', type: 'button' }, 'show all ' + count(text.length) + ' characters');
  more.addEventListener('click', () => {
    clear(pre);
    add(pre, text);
    more.remove();
    add(box, note);
  });
  box.appendChild(more);
  return box;
}

// ---- views and routing -------------------------------------------------

const views = ['live', 'trees', 'transcripts'];

function route() {
  const [view, ...rest] = (location.hash.slice(1) || 'live').split('/');
  const name = views.includes(view) ? view : 'live';
  const arg = rest.length ? decodeURIComponent(rest.join('/')) : '';
  for (const v of views) {
    $('view-' + v).hidden = v !== name;
    $('tab-' + v).classList.toggle('active', v === name);
  }
  if (name === 'trees') Trees.open(arg);
  if (name === 'transcripts') Transcripts.open(arg);
  if (name === 'live') Runs.draw();
}

function go(view, id) {
  location.hash = '#' + view + (id ? '/' + encodeURIComponent(id) : '');
}

// ---- Live ---------------------------------------------------------------

const Live = {
  hasBoard: false,
  start() {
    api('live').then((snapshot) => {
      if (snapshot.board === false) {
        $('no-batch').hidden = false;
        $('status').textContent = 'history only';
        // The requests a batch of another process parked in this home.
        if (snapshot.approvals) this.listen();
        return;
      }
      this.hasBoard = true;
      this.render(snapshot);
      this.listen();
    }).catch((error) => { $('status').textContent = shown('error: ' + error.message); });
  },
  listen() {
    const source = new EventSource('/api/events?' + new URLSearchParams({ token: TOKEN }).toString());
    source.addEventListener('live', (event) => this.render(JSON.parse(event.data)));
    source.addEventListener('approvals', (event) => Approvals.render(JSON.parse(event.data)));
    source.onopen = () => { $('status').textContent = 'live'; $('status').className = 'status on'; };
    source.onerror = () => { $('status').textContent = 'reconnecting…'; $('status').className = 'status off'; };
  },
  render(s) {
    const figures = $('figures');
    clear(figures);
    const card = (label, value, cls) => figures.appendChild(el('div', { class: 'figure ' + (cls || '') }, el('span', { class: 'value' }, value), el('span', { class: 'label' }, label)));
    card('settled', count(s.settled) + (s.total !== null && s.total !== undefined ? ' / ' + count(s.total) : ''));
    card('running', count(s.running));
    card('failed', count(s.failed), s.failed ? 'bad' : '');
    card('rate', (s.rate_per_s || 0).toFixed(1) + ' /s');
    card(s.following_file ? 'following the file for' : 'elapsed', human(s.elapsed_ms));
    card('ETA', s.finished ? 'done' : human(s.eta_ms));
    card('tokens', count(s.tokens));
    card('waited on limits', human(s.limit_wait_ms));
    if (s.skipped) card('skipped lines', count(s.skipped));
    if (s.done_before) card('done before', count(s.done_before));
    if (s.retries) card('retries', count(s.retries));
    if (s.lost) figures.appendChild(el('div', { class: 'figure bad wide' }, el('span', { class: 'label' }, 'results lost: '), s.lost));

    const outcomes = $('outcomes');
    clear(outcomes);
    outcomes.appendChild(el('tr', {}, el('th', {}, 'outcome'), el('th', {}, 'runs')));
    for (const [outcome, n] of Object.entries(s.outcomes || {})) {
      outcomes.appendChild(el('tr', { data: { outcome } }, el('td', { class: outcomeClass(outcome) }, outcome), el('td', { class: 'num' }, count(n))));
    }
    const providers = $('providers');
    clear(providers);
    providers.appendChild(el('tr', {}, el('th', {}, 'provider'), el('th', {}, 'running'), el('th', {}, 'done'), el('th', {}, 'not completed'), el('th', { title: 'of its tasks, their children included' }, 'task tokens'), el('th', { title: 'on rate limits, by its tasks' }, 'task waits')));
    if (!(s.providers || []).length) {
      providers.appendChild(el('tr', {}, el('td', { class: 'note' }, 'no runs yet')));
    }
    for (const p of s.providers || []) {
      // A followed file tells what settled, not what runs.
      const running = s.following_file && !p.running ? '–' : count(p.running);
      providers.appendChild(el('tr', { data: { provider: p.name } }, el('td', {}, p.name), el('td', { class: 'num' }, running), el('td', { class: 'num' }, count(p.done)), el('td', { class: 'num' }, count(p.failed)), el('td', { class: 'num' }, count(p.tokens)), el('td', { class: 'num' }, human(p.limit_wait_ms))));
    }
    Routes.render(s.routes || []);
    $('failure-count').textContent = s.failed ? '(' + count(s.failed) + '; newest first)' : '';
    const failures = $('failures');
    clear(failures);
    for (const row of s.recent_failures || []) {
      failures.appendChild(el('li', {},
        el('span', { class: 'line' }, 'line ' + row.line), ' ',
        el('span', { class: 'label' }, row.label || row.id || ''), ' ',
        el('span', { class: 'bad' }, row.outcome), row.detail ? ': ' : '', row.detail ? el('span', { class: 'reason' }, row.detail) : null));
    }
    Runs.update(s.settled);
    Trees.refresh();
  },
};

// The model routes and whatever figures their limiters give: a column per
// key the server sends (times in `_ms`), so a new figure needs no change here.
const Routes = {
  render(routes) {
    $('routes-box').hidden = !routes.length;
    const table = $('routes');
    clear(table);
    if (!routes.length) return;
    const keys = [];
    for (const r of routes) for (const key of Object.keys(r)) if (key !== 'name' && !keys.includes(key)) keys.push(key);
    table.appendChild(el('tr', {}, el('th', {}, 'route'), ...keys.map((key) => el('th', {}, key.replace(/_ms$/, '').replace(/_/g, ' ')))));
    for (const r of routes) {
      const cell = (key) => {
        const v = r[key];
        if (v === null || v === undefined) return el('td', { class: 'num' }, '–');
        if (typeof v === 'number') return el('td', { class: 'num' }, key.endsWith('_ms') ? human(v) : count(v));
        return el('td', {}, typeof v === 'object' ? JSON.stringify(v) : String(v));
      };
      table.appendChild(el('tr', { data: { route: r.name } }, el('td', {}, r.name), ...keys.map(cell)));
    }
  },
};

// The permission requests parked in the home, each answerable from here:
// a POST with the token in a header, as `subagents approve` answers (the
// first answer wins; a later one is refused and said so).
const Approvals = {
  render(list) {
    $('approvals-box').hidden = false;
    const box = $('approvals');
    clear(box);
    const requests = list.requests || [];
    $('approvals-count').textContent = requests.length ? '(' + count(requests.length + (list.more || 0)) + ')' : '';
    if (list.error) $('approvals-note').textContent = shown(list.error);
    for (const r of requests) box.appendChild(this.item(r));
  },
  item(r) {
    const path = (r.asker || []).map((hop) => hop.provider + (hop.label ? ' (' + hop.label + ')' : '')).join(' › ');
    const last = (r.asker || [])[r.asker.length - 1];
    const what = r.title || r.tool || r.kind || 'a tool call';
    const item = el('li', { class: 'approval', data: { id: r.id } },
      el('div', { class: 'who' }, el('span', { class: 'id' }, r.id), ' ',
        el('span', { class: 'label' }, last ? last.provider + (last.label ? ' (' + last.label + ')' : '') : 'a child'),
        last ? el('span', { class: 'when' }, ' at depth ' + last.depth + (r.asker.length > 1 ? ' · ' + path : '')) : null,
        el('span', { class: 'when' }, ' · waiting since ' + time(r.parked_at_ms))),
      el('div', { class: 'what' }, 'asks to run ', el('span', { class: 'tool' }, what),
        r.kind && (r.title || r.tool) ? el('span', { class: 'kind' }, r.kind) : null),
      r.input ? el('pre', { class: 'input' }, r.input) : null,
      (r.paths || []).length ? el('div', { class: 'when' }, 'touches ' + r.paths.join(', ')) : null,
      r.always_covers ? el('div', { class: 'when' }, 'always would cover ' + r.always_covers) : null);
    const buttons = el('div', { class: 'answers' });
    const note = el('span', { class: 'answer-note' });
    for (const [word, label] of [['allow', 'allow once'], ['always', 'allow always'], ['reject', 'reject']]) {
      const button = el('button', { type: 'button', class: 'answer ' + word, data: { answer: word } }, label);
      // What "always" covers, as the request says it (the tool, else only this same call).
      if (word === 'always' && r.always_covers) button.title = 'allow always: ' + r.always_covers;
      button.disabled = word !== 'reject' && r.offers && !r.offers[word];
      button.addEventListener('click', () => this.answer(r.id, word, buttons, note));
      buttons.appendChild(button);
    }
    buttons.appendChild(note);
    item.appendChild(buttons);
    return item;
  },
  answer(id, word, buttons, note) {
    for (const b of buttons.querySelectorAll('button')) b.disabled = true;
    note.textContent = 'answering…';
    fetch('/api/approve', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-subagents-token': TOKEN },
      body: JSON.stringify({ id, answer: word }),
      cache: 'no-store',
      credentials: 'omit',
    }).then(async (response) => {
      let answer = {};
      try { answer = await response.json(); } catch (_) { /* not JSON */ }
      note.textContent = shown(response.ok ? 'answered: ' + answer.verdict : 'refused: ' + (answer.error || response.statusText));
      note.className = 'answer-note ' + (response.ok ? 'ok' : 'bad');
      $('approvals-note').textContent = note.textContent;
    }).catch((error) => { note.textContent = shown('failed: ' + error.message); });
  },
};

// The settled runs, a window at a time: the list is as tall as all of
// them, and only the rows in view exist.
const Runs = {
  total: 0,
  pages: new Map(),
  pending: new Set(),
  filter: '',
  query: '',
  lastRefresh: 0,
  update(settled) {
    if (this.filter || this.query) {
      // A filtered list is read again at most once a second.
      if (Date.now() - this.lastRefresh > 1000) this.reset();
      return;
    }
    if (settled !== this.total) {
      // The page that held the old end may have grown.
      this.pages.delete(Math.floor(this.total / PAGE_ROWS));
      this.total = settled;
      this.draw();
    }
  },
  reset() {
    this.pages.clear();
    this.lastRefresh = Date.now();
    this.fetch(0);
  },
  fetch(page) {
    if (this.pending.has(page)) return;
    this.pending.add(page);
    api('runs', { offset: page * PAGE_ROWS, limit: PAGE_ROWS, filter: this.filter, q: this.query }).then((answer) => {
      this.pending.delete(page);
      this.pages.set(page, answer.rows);
      this.total = answer.total;
      this.draw();
    }).catch(() => this.pending.delete(page));
  },
  draw() {
    const box = $('runs');
    if (!box || box.offsetParent === null) return;
    $('runs-spacer').style.height = this.total * ROW_HEIGHT + 'px';
    $('runs-count').textContent = count(this.total) + ' runs';
    const first = Math.floor(box.scrollTop / ROW_HEIGHT);
    const last = Math.min(this.total, first + Math.ceil(box.clientHeight / ROW_HEIGHT) + 4);
    for (const old of box.querySelectorAll('.run')) old.remove();
    for (let index = first; index < last; index++) {
      const page = Math.floor(index / PAGE_ROWS);
      const rows = this.pages.get(page);
      if (!rows) { this.fetch(page); continue; }
      const row = rows[index - page * PAGE_ROWS];
      if (!row) continue;
      const line = el('div', { class: 'run', data: { index: String(index) } },
        el('span', {}, String(row.line)),
        el('span', { title: row.label || '' }, row.label || row.id || '',
          row.step ? el('span', { class: 'step' }, ' · step ' + row.step + (row.waits_on && row.waits_on.length ? ', after ' + row.waits_on.join(', ') : '')) : null),
        el('span', { class: outcomeClass(row.outcome) }, row.outcome),
        el('span', { class: 'num' }, human(row.latency_ms)),
        el('span', { class: 'num' }, count(row.tokens)),
        el('span', { class: 'reason', title: row.detail || '' }, row.detail || ''));
      line.style.top = index * ROW_HEIGHT + 'px';
      if (row.child) line.addEventListener('click', () => go('trees', row.child));
      box.appendChild(line);
    }
  },
};

// ---- Trees --------------------------------------------------------------

const Trees = {
  rootsOffset: 0,
  current: null,
  nodes: [],
  // The nodes unfolded by hand, kept across the tree's refreshes.
  unfolded: new Set(),
  lastRefresh: 0,
  // While a batch runs, the tree in view is read again every 2 s (a large
  // one only by its reload button: redrawing thousands of rows stalls).
  refresh() {
    if (!this.current || $('view-trees').hidden || Date.now() - this.lastRefresh < 2000) return;
    if (this.nodes.length > 500) return;
    this.load(this.current, true);
  },
  open(id) {
    this.loadRoots();
    if (id && id !== this.current) this.load(id);
  },
  loadRoots() {
    api('roots', { offset: this.rootsOffset, limit: 50 }).then((answer) => {
      const list = $('roots');
      clear(list);
      if (Live.hasBoard && this.rootsOffset === 0) {
        list.appendChild(el('li', { class: 'batch', onclick: () => go('trees', 'batch') }, 'this batch'));
      }
      for (const root of answer.roots) {
        list.appendChild(el('li', { onclick: () => go('trees', root.id), title: root.id },
          el('span', { class: 'id' }, root.id.slice(0, 8)), ' ',
          el('span', { class: outcomeClass(root.last_stop_reason || '') }, root.last_stop_reason || 'no finished turn'), ' ',
          el('span', { class: 'when' }, time(root.created_at_ms))));
      }
      pager($('roots-pager'), this.rootsOffset, 50, answer.total, (offset) => { this.rootsOffset = offset; this.loadRoots(); });
    }).catch(() => {});
  },
  load(id, again) {
    if (!again) this.unfolded.clear();
    this.lastRefresh = Date.now();
    this.current = id;
    $('tree-title').textContent = shown(id === 'batch' ? 'This batch' : 'Tree under ' + id);
    api('tree', { id }).then((answer) => {
      this.nodes = answer.nodes;
      $('tree-note').textContent = answer.left_out ? count(answer.left_out) + ' more nodes not shown' : count(answer.nodes.length) + ' nodes';
      this.render();
    }).catch((error) => {
      clear($('tree'));
      $('tree-note').textContent = shown(error.message);
    });
  },
  render() {
    const tree = $('tree');
    clear(tree);
    // The tree's span of time: every bar is placed on it, so the bars
    // down the tree are its waterfall.
    const timed = this.nodes.filter((node) => node.start_ms);
    const first = timed.length ? Math.min(...timed.map((n) => n.start_ms)) : 0;
    // A run still going ends, for now, now.
    const endOf = (node) => node.end_ms || (node.state === 'running' ? Math.max(Date.now(), node.start_ms) : node.start_ms);
    const last = timed.length ? Math.max(...timed.map(endOf)) : 0;
    const span = Math.max(last - first, 1);
    clear($('waterfall'));
    if (timed.length) $('waterfall').append(el('span', {}, 'from ' + time(first)), el('span', {}, human(span) + ' in all'));
    // The flat depth-first list nests into lists, one per open parent.
    const open = [tree];
    for (const node of this.nodes) {
      open.length = node.level + 1;
      const parent = open[node.level];
      const item = el('li', { class: 'node', data: { id: node.id, level: String(node.level), kind: node.kind || '' } });
      const toggle = el('button', { class: 'toggle', type: 'button', title: node.children ? 'fold or unfold' : '' }, node.children ? (node.level === 0 ? '▾' : '▸') : '·');
      const duration = node.end_ms && node.start_ms ? human(node.end_ms - node.start_ms) : (node.latency_ms !== undefined ? human(node.latency_ms) : '');
      const title = el('span', { class: 'title' },
        el('span', { class: 'kind' }, node.kind || '?'), ' ',
        el('span', { class: 'label' }, node.label || (node.id === 'batch' ? 'this batch' : node.id)), ' ',
        el('span', { class: 'state ' + outcomeClass(node.state) }, node.state || ''), ' ',
        duration ? el('span', { class: 'duration' }, duration) : null, ' ',
        node.tokens ? el('span', { class: 'tokens' }, count(node.tokens) + ' tokens') : null,
        node.children ? el('span', { class: 'kids' }, ' · ' + count(node.children) + ' children') : null,
        node.stopped_with ? el('span', { class: 'stopped-with' }, ' · stopped with ' + node.stopped_with.kind + ' ' + node.stopped_with.name) : null);
      // The runs a cancel passes through to reach this one.
      const path = (node.path || []).map((above) => above.name).join(' › ');
      if (path) {
        title.title = shown('cancelled with any of: ' + path);
        title.dataset.path = shown(path);
      }
      if (node.session) title.addEventListener('click', () => go('transcripts', node.id));
      const track = el('span', { class: 'track' });
      if (node.start_ms) {
        const ended = endOf(node);
        const bar = el('span', { class: 'bar ' + outcomeClass(node.state) + (node.end_ms ? '' : ' open'), title: (node.label || node.id) + ': ' + (node.end_ms ? human(node.end_ms - node.start_ms) : node.state === 'running' ? 'running' : 'end not recorded') });
        bar.style.left = ((node.start_ms - first) / span) * 100 + '%';
        bar.style.width = Math.max(((ended - node.start_ms) / span) * 100, 0.5) + '%';
        track.appendChild(bar);
      }
      const row = el('div', { class: 'row' }, toggle, title, track);
      row.style.paddingLeft = Math.min(node.level, 24) * 18 + 'px';
      item.appendChild(row);
      const kids = el('ul', {});
      kids.hidden = node.level > 0 && !this.unfolded.has(node.id);
      item.appendChild(kids);
      if (node.children) {
        item.classList.add('has-children');
        toggle.textContent = kids.hidden ? '▸' : '▾';
        toggle.addEventListener('click', () => {
          kids.hidden = !kids.hidden;
          toggle.textContent = kids.hidden ? '▸' : '▾';
          if (kids.hidden) this.unfolded.delete(node.id); else this.unfolded.add(node.id);
        });
      }
      parent.appendChild(item);
      open[node.level + 1] = kids;
    }
  },
  setAll(hidden) {
    for (const item of $('tree').querySelectorAll('li.has-children')) {
      if (item.dataset.level === '0') continue;
      item.querySelector(':scope > ul').hidden = hidden;
      item.querySelector(':scope > .row > .toggle').textContent = hidden ? '▸' : '▾';
      if (hidden) this.unfolded.delete(item.dataset.id); else this.unfolded.add(item.dataset.id);
    }
  },
};

function pager(box, offset, size, total, go) {
  clear(box);
  if (total <= size) return;
  const prev = el('button', { type: 'button' }, '‹ newer');
  prev.disabled = offset === 0;
  prev.addEventListener('click', () => go(Math.max(0, offset - size)));
  const next = el('button', { type: 'button' }, 'older ›');
  next.disabled = offset + size >= total;
  next.addEventListener('click', () => go(offset + size));
  box.append(prev, el('span', {}, (offset + 1) + '–' + Math.min(offset + size, total) + ' of ' + count(total)), next);
}

// ---- Transcripts --------------------------------------------------------

const Transcripts = {
  offset: 0,
  current: null,
  open(id) {
    if (!this.listed) { this.list(); this.listed = true; }
    if (id && id !== this.current) this.show(id);
  },
  list() {
    api('sessions', { offset: this.offset, limit: 50 }).then((answer) => {
      const list = $('sessions');
      clear(list);
      for (const s of answer.sessions) list.appendChild(this.item(s.id, [el('span', { class: outcomeClass(s.last_stop_reason || '') }, s.last_stop_reason || 'no finished turn'), ' ', el('span', { class: 'when' }, time(s.created_at_ms)), ' ', el('span', { class: 'kind' }, s.kind)]));
      $('search-note').textContent = answer.unreadable ? count(answer.unreadable) + ' sessions could not be read' : '';
      pager($('sessions-pager'), this.offset, 50, answer.total, (offset) => { this.offset = offset; this.list(); });
    }).catch(() => {});
  },
  item(id, extra) {
    return el('li', { onclick: () => go('transcripts', id), title: id }, el('span', { class: 'id' }, id.slice(0, 8)), ' ', ...extra);
  },
  search(query) {
    if (!query) { this.list(); return; }
    $('search-note').textContent = 'searching…';
    api('search', { q: query }).then((answer) => {
      const list = $('sessions');
      clear(list);
      clear($('sessions-pager'));
      $('search-note').textContent = count(answer.hits.length) + ' sessions match (' + count(answer.searched) + ' of ' + count(answer.total) + ' searched)';
      for (const hit of answer.hits) list.appendChild(this.item(hit.id, [el('span', { class: 'snippet' }, hit.snippet)]));
    }).catch((error) => { $('search-note').textContent = shown(error.message); });
  },
  show(id) {
    this.current = id;
    $('transcript-title').textContent = shown('Session ' + id);
    const box = $('transcript');
    const meta = $('transcript-meta');
    clear(box);
    clear(meta);
    api('session', { id }).then((t) => {
      const s = t.session;
      this.session = s;
      meta.append(
        el('span', { class: 'kind' }, s.kind), s.provider ? ' ' : '', s.provider ? el('span', { class: 'kind' }, s.provider) : null,
        s.label ? ' ' : '', s.label ? el('span', { class: 'label' }, plain(s.label)) : null, ' depth ' + s.depth + ' · created ' + time(s.created_at_ms) + ' · ',
        el('span', { class: outcomeClass(s.last_stop_reason || '') }, s.last_stop_reason || 'no finished turn'),
        s.torn ? ' · a torn last line was left out' : '');
      if (s.parent) {
        meta.append(' · parent ', el('button', { class: 'linkish', type: 'button', onclick: () => go('transcripts', s.parent) }, s.parent));
      }
      meta.append(' ', el('button', { class: 'linkish', type: 'button', onclick: () => go('trees', id) }, 'tree'));
      if (t.failure) box.appendChild(this.failure(t.failure));
      if (t.persona) box.appendChild(el('div', { class: 'event persona' }, el('h3', {}, 'persona'), folded(t.persona)));
      for (const event of t.events) box.appendChild(this.event(event));
      if (t.left_out) box.appendChild(el('p', { class: 'note' }, 'the rest of this session was not sent: it is longer than a page shows'));
    }).catch((error) => { box.appendChild(el('p', { class: 'note bad' }, error.message)); });
  },
  // Why the run failed, above its transcript: how its last turn ended,
  // its recorder's account, and the batch's outcome and reason.
  failure(f) {
    const box = el('div', { class: 'failure-banner' }, el('h3', {}, 'failed'));
    const line = (label, value, cls) => value ? box.appendChild(el('p', {}, el('span', { class: 'label' }, label + ': '), el('span', { class: cls || 'reason' }, plain(value)))) : null;
    line('stop reason', f.stop_reason, 'bad');
    line('outcome in the batch', f.outcome !== f.stop_reason ? f.outcome : null, 'bad');
    line('reason', f.detail);
    if (f.account) box.appendChild(el('div', { class: 'account' }, el('span', { class: 'label' }, 'the run\'s account:'), folded(f.account)));
    return box;
  },
  // A permission request the child made and the answer it got.
  permission(event) {
    const node = el('div', { class: 'event permission ' + (event.allowed ? 'allowed' : 'rejected') }, el('h4', {}, '? permission ', el('span', { class: 'call-id' }, plain(event.call_id))));
    if (event.text !== undefined) { node.appendChild(folded(event.text)); return node; }
    const s = (this.session || {});
    const asker = [s.provider || s.kind, plain(s.label)].filter((x) => x).join(' · ');
    const field = (label, value, cls) => node.appendChild(el('div', { class: 'field' }, el('span', { class: 'label' }, label), el('span', { class: cls || '' }, plain(value))));
    field('asked by', 'this child' + (asker ? ' (' + asker + ')' : ''));
    field('to run', event.call, 'tool');
    if (plain(event.options)) field('offering', event.options);
    field('answer', event.answer, event.allowed ? 'ok verdict' : 'bad verdict');
    field('answered by', event.by, 'by');
    return node;
  },
  event(event) {
    switch (event.type) {
      case 'permission':
        return this.permission(event);
      case 'user':
        return el('div', { class: 'event user' }, el('h3', {}, 'user'), folded(event.text));
      case 'assistant': {
        const node = el('div', { class: 'event assistant' }, el('h3', {}, 'assistant'));
        if (event.text && (event.text.length || event.text.text)) node.appendChild(folded(event.text));
        for (const call of event.tool_calls) {
          node.appendChild(el('div', { class: 'tool-call' }, el('h4', {}, '→ ', el('span', { class: 'tool' }, typeof call.name === 'string' ? call.name : call.name.text), ' ', el('span', { class: 'call-id' }, typeof call.id === 'string' ? call.id : '')), folded(call.arguments)));
        }
        return node;
      }
      case 'tool_result':
        return el('div', { class: 'event tool-result' + (event.is_error ? ' error' : '') },
          el('h4', {}, '← ', el('span', { class: 'tool' }, typeof event.name === 'string' ? event.name : event.name.text), ' ', el('span', { class: 'call-id' }, typeof event.call_id === 'string' ? event.call_id : ''), event.is_error ? ' error' : ' result'),
          folded(event.content));
      case 'turn_end':
        return el('div', { class: 'event turn-end' }, '— turn end: ', el('span', { class: outcomeClass(event.reason) }, event.reason));
      default:
        return el('div', { class: 'event' }, el('h3', {}, String(event.type)), folded(event.json || JSON.stringify(event)));
    }
  },
};

// ---- start ---------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  $('runs').addEventListener('scroll', () => Runs.draw(), { passive: true });
  $('runs-filter').addEventListener('change', (e) => { Runs.filter = e.target.value; Runs.reset(); });
  $('runs-query').addEventListener('input', (e) => { Runs.query = e.target.value; Runs.reset(); });
  $('expand-all').addEventListener('click', () => Trees.setAll(false));
  $('collapse-all').addEventListener('click', () => Trees.setAll(true));
  $('reload-tree').addEventListener('click', () => { if (Trees.current) Trees.load(Trees.current, true); });
  $('search').addEventListener('keydown', (e) => { if (e.key === 'Enter') Transcripts.search(e.target.value.trim()); });
  window.addEventListener('hashchange', route);
  window.addEventListener('resize', () => Runs.draw());
  Live.start();
  route();
});
