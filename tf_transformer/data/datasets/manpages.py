"""German man pages from manpages-de, aligned paragraph by paragraph with the English originals.

The German pages come from ``manpages-de`` and ``manpages-de-dev``
(``usr/share/man/de/manN/``). The English page of the same name and section
(``usr/share/man/manN/``) is looked up in :data:`ENGLISH_PACKAGES`, a fixed list:
``manpages`` and ``manpages-dev`` first, then the packages of the programs whose
pages manpages-de translates most (coreutils, util-linux, systemd, grub, sane,
openssh, gettext, texinfo, ...). The first package in that order that has the
page wins, so the result does not depend on what is installed on this machine.

A page that is a symlink or a ``.so`` redirect is followed to the page it names
(in any package of the same language); a page reached twice is used once.
Each German/English page pair is rendered to plain text with groff (a line
length of 20,000 ens, no hyphenation, no justification, no bold or underline),
which puts each paragraph on one line, and the two paragraph sequences are
aligned by :func:`align`, a Gale-Church-like dynamic programme. Rendering and
alignment run in one process per CPU core. Only 1-1 matches are kept; a paragraph
without a counterpart (the German translator credits, text the English page
gained in a newer version) is left out. A ``.so`` request inside a longer page
is not followed (groff reads the page from standard input).

Document ids are ``manpages:<page>.<section>`` of the German page shown, after
redirects (``manpages:bzip2.1`` also stands for bunzip2.1 and bzcat.1).
"""

import concurrent.futures
import gzip
import math
import os
import re
import subprocess

from tf_transformer.errors import UserError

NAME = "manpages"
LICENSE = "GPL-3.0-or-later"
GERMAN_PACKAGES = ("manpages-de", "manpages-de-dev")
ENGLISH_PACKAGES = (
    "manpages", "manpages-dev",
    "coreutils", "util-linux", "util-linux-extra", "bsdutils", "bsdextrautils", "mount", "fdisk",
    "eject", "uuid-runtime", "rfkill", "findutils", "grep", "sed", "tar", "gzip", "bzip2", "cpio",
    "diffutils", "less", "nano", "file", "ed", "make", "gettext", "gettext-base", "texinfo",
    "install-info", "info",
    "systemd", "systemd-container", "systemd-homed", "systemd-resolved", "systemd-timesyncd",
    "systemd-journal-remote", "systemd-boot", "systemd-coredump", "systemd-oomd", "systemd-userdbd",
    "systemd-sysv", "udev", "libnss-systemd", "libnss-myhostname", "libnss-mymachines",
    "libnss-resolve", "libpam-systemd", "init-system-helpers", "sysvinit-utils",
    "kbd", "dosfstools", "e2fsprogs", "btrfs-progs", "parted", "grub-common", "grub2-common",
    "openssh-client", "openssh-server", "mtools", "mutt", "sane-utils", "libsane-common", "sysstat",
    "nfs-common", "nfs-kernel-server", "kmod", "iptables", "usbutils", "cron", "anacron", "at",
    "libc-bin", "locales", "hostname", "ncal", "ncurses-bin", "groff", "groff-base", "wdiff",
    "recutils", "vorbis-tools", "psutils", "bash", "wodim", "acct", "vlock", "thinkfan", "exif",
    "netpbm", "x11-xserver-utils", "x11-apps", "uuid-dev", "libblkid-dev", "libcrypt-dev",
    "glibc-doc", "binutils", "zstd", "autopoint", "sharutils", "talkd", "rwho", "bsdgames", "binkd",
    "ddate",
)
PACKAGES = GERMAN_PACKAGES + ENGLISH_PACKAGES

_GERMAN_MAN = os.path.join("usr", "share", "man", "de")
_ENGLISH_MAN = os.path.join("usr", "share", "man")
_PAGE_FILE = re.compile(r"^(.+\.[0-9][a-z0-9]*)(\.gz)?$")    # ls.1.gz -> ls.1
_SO_REQUEST = re.compile(r"^\.so\s+(\S+)\s*$")
_MAX_REDIRECTS = 5

# groff for a terminal, made independent of the caller's locale and groff settings.
_GROFF = ("groff", "-Kutf-8", "-t", "-mandoc", "-Tutf8", "-P-cbou",
          "-rLL=20000n", "-rLT=20000n", "-rHY=0", "-dAD=l")
_GROFF_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}

# Gale-Church: English characters per German character, variance per character,
# and the cost (-log prior) of a 1-1 match and of leaving a paragraph unmatched.
_CHAR_RATIO = 0.85
_VARIANCE = 6.8
_MATCH_COST = -math.log(0.89)
_SKIP_COST = -math.log(0.01)
_BAND = 100   # how far the alignment may stray from the diagonal, beyond the length difference


def page_index(man_roots):
    """``{"ls.1": path}`` for the page files in the ``manN`` folders of each root; the first
    root that has a page wins."""
    index = {}
    for root in man_roots:
        if not os.path.isdir(root):
            continue
        for section in sorted(os.listdir(root)):
            folder = os.path.join(root, section)
            if not (section.startswith("man") and os.path.isdir(folder)):
                continue
            for name in sorted(os.listdir(folder)):
                match = _PAGE_FILE.match(name)
                if match:
                    index.setdefault(match.group(1), os.path.join(folder, name))
    return index


def _read_page(path):
    """A page file's roff source (gzip or plain; UTF-8, else Latin-1)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _redirect(path):
    """The page key a symlink or a one-line ``.so`` page points to, else None."""
    if os.path.islink(path):
        match = _PAGE_FILE.match(os.path.basename(os.readlink(path)))
        return match.group(1) if match else None
    lines = [line for line in _read_page(path).splitlines()
             if line.strip() and not line.startswith(('.\\"', "'\\\""))]
    match = _SO_REQUEST.match(lines[0]) if len(lines) == 1 else None
    return _PAGE_FILE.match(os.path.basename(match.group(1))).group(1) if match else None


def resolve(key, index):
    """The key of the page that ``key`` finally shows (following symlinks and ``.so``), or
    None when it points to a page missing from ``index`` or redirects too often."""
    for _ in range(_MAX_REDIRECTS):
        if key not in index:
            return None
        target = _redirect(index[key])
        if target is None:
            return key
        key = target
    return None


def render(roff):
    """Plain text of a page's roff source, rendered by groff with each paragraph on one line."""
    try:
        done = subprocess.run(_GROFF, input=roff.encode("utf-8"), capture_output=True,
                              env=_GROFF_ENV, check=False)
    except FileNotFoundError:
        raise UserError("groff is not installed; the man-page source needs it "
                        "(apt-get install groff-base)") from None
    return done.stdout.decode("utf-8", errors="replace")


def paragraphs(rendered):
    """The paragraphs of rendered text: its non-blank lines, whitespace collapsed, without the
    first and last one (the page header and footer)."""
    lines = [" ".join(line.split()) for line in rendered.splitlines()]
    return [line for line in lines if line][1:-1]


def _match_cost(german, english):
    """Gale-Church cost of pairing two paragraphs: low when the lengths fit, 0 when identical."""
    if german == english:
        return 0.0
    l1, l2 = len(german), len(english)
    mean = max((l1 + l2 / _CHAR_RATIO) / 2, 1.0)
    delta = abs(l2 - _CHAR_RATIO * l1) / math.sqrt(_VARIANCE * mean)
    return _MATCH_COST - math.log(max(math.erfc(delta / math.sqrt(2)), 1e-300))


def align(german, english):
    """``[(german, english), ...]``: the 1-1 matches of the cheapest alignment of two paragraph
    lists in order, where a paragraph may also stay unmatched (at :data:`_SKIP_COST`)."""
    n, m = len(german), len(english)
    band = abs(n - m) + _BAND
    cost = {(0, 0): 0.0}
    step = {}
    for i in range(n + 1):
        for j in range(max(0, i - band), min(m, i + band) + 1):
            if i == j == 0:
                continue
            options = []
            if i and j and (i - 1, j - 1) in cost:
                options.append((cost[i - 1, j - 1] + _match_cost(german[i - 1], english[j - 1]), "match"))
            if i and (i - 1, j) in cost:
                options.append((cost[i - 1, j] + _SKIP_COST, "german"))
            if j and (i, j - 1) in cost:
                options.append((cost[i, j - 1] + _SKIP_COST, "english"))
            cost[i, j], step[i, j] = min(options)
    pairs = []
    i, j = n, m
    while i or j:
        move = step[i, j]
        if move == "match":
            pairs.append((german[i - 1], english[j - 1]))
        i, j = i - (move != "english"), j - (move != "german")
    return pairs[::-1]


def _page_pairs(job):
    """Worker: renders one German and one English page and aligns their paragraphs."""
    document_id, german_roff, english_roff = job
    return document_id, align(paragraphs(render(german_roff)), paragraphs(render(english_roff)))


def _jobs(cache):
    """``(document_id, german roff, english roff)`` for each German page with an English page,
    each German page once."""
    german = page_index([os.path.join(cache.package_tree(p), _GERMAN_MAN) for p in GERMAN_PACKAGES])
    english = page_index([os.path.join(cache.package_tree(p), _ENGLISH_MAN) for p in ENGLISH_PACKAGES])
    if not german:
        raise UserError(f"packages {', '.join(GERMAN_PACKAGES)} hold no man pages under {_GERMAN_MAN}")
    jobs, seen = [], set()
    for key in sorted(german):
        shown = resolve(key, german)
        if shown is None or shown in seen:
            continue
        seen.add(shown)
        english_shown = resolve(shown, english) or resolve(key, english)
        if english_shown is not None:
            jobs.append((f"{NAME}:{shown}", _read_page(german[shown]), _read_page(english[english_shown])))
    return jobs


def documents(cache, log):
    """Yields ``(document_id, [(german, english), ...])`` for every German man page with an
    English original and at least one aligned pair, in page order."""
    jobs = _jobs(cache)
    log(f"manpages: rendering and aligning {len(jobs)} German/English page pairs "
        f"on {os.cpu_count() or 1} cores")
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for done, (document_id, pairs) in enumerate(pool.map(_page_pairs, jobs, chunksize=4), 1):
            if done % 200 == 0:
                log(f"manpages: {done}/{len(jobs)} pages")
            if pairs:
                yield document_id, pairs
