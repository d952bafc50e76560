"""flagperf.hosts.buildsteps: a Dockerfile and an install script read as Docker and the shell run them, for vendor
check's packages/ check (tests/unit/test_vendor_check.py holds the check itself)."""

from __future__ import annotations

from flagperf.hosts.buildsteps import (
    BuildWrites,
    Shell,
    dockerfile_instructions,
    heredocs,
    run_scripts,
    shell_lines,
    shell_words,
)


def read(*lines: str) -> tuple[list[str], BuildWrites]:
    """The packages/ paths the lines (one shell's, in order) name, as paths of the context, and what they write."""
    writes, shell, named = BuildWrites(), Shell(), []
    for line in lines:
        named += [found.path for found in writes.read(shell_words(line), shell)]
    return named, writes


def each(*lines: str) -> list[str]:
    """The packages/ paths each line names, each in a shell of its own."""
    return [found.path for line in lines for found in BuildWrites().read(shell_words(line))]


def test_install_d_makes_every_folder_it_names_and_install_copies_to_its_last() -> None:
    """install -d a b wrote b alone (read as install's copy: the last argument), so a file fetched into a was said
    missing; -m's value was taken for a path. Now -d (alone or in a cluster, -dm755) makes each folder, a copy
    writes its destination, -t DIR writes DIR and never a source, and an option's value is no path."""
    _, writes = read("install -d packages/a packages/b", "install -dm755 packages/c",
                     "install -m 0755 -o root /tmp/x.run packages/d/x.run", "install -t packages/e packages/src.run",
                     "(install /tmp/y.run packages/f.run 2>&1);")  # a subshell, and a redirected descriptor
    assert writes.written == ["packages/a", "packages/b", "packages/c", "packages/d/x.run", "packages/e",
                              "packages/f.run"]
    assert not writes.made("packages/src.run") and not writes.made("0755")


def test_a_command_after_sudo_env_or_an_assignment_is_read_as_the_command() -> None:
    """sudo -E mkdir packages/x was read as the command -E: what it made was said missing. The words that run a
    command (sudo, env, nohup, exec, time) with their options, and NAME=value assignments, are passed over; one that
    runs it in another folder (sudo -D, env -C) makes its relative paths unknown, so nothing is said of them."""
    named, writes = read("sudo -E mkdir -p packages/a", "sudo -u root --preserve-env=PATH env -u HOME A=1 "
                         "mkdir packages/b", "VAR=1 OTHER='x y' install -d packages/c", "nohup env - touch packages/d",
                         "env -C /opt mkdir packages/e && sudo -D /opt sh packages/f.run")
    assert writes.written == ["packages/a", "packages/b", "packages/c", "packages/d"]
    assert named == ["packages/a", "packages/b", "packages/c", "packages/d"]


def test_a_relative_path_after_cd_is_from_the_folder_cd_went_to() -> None:
    """cd packages && ./x.sh named nothing (./x.sh has no packages/ in it): a missing installer went unsaid. A cd
    (or pushd) moves the shell for the rest of its commands, a subshell's only within it, and a word that names a
    file (a / in it, a package's ending, a shell's script) is read from there; cd to an absolute path or a variable
    makes the place unknown, and nothing is said of its relative paths."""
    named, writes = read("cd packages && ./x.sh && sh y.run --silent && pip install wheels/*.whl torch",
                         "mkdir build; sh build/a.run; (cd sub && ./b.sh); ./c.sh",
                         "cd .. && sh packages/d.run && cd $HOME && sh packages/e.run")
    assert named == ["packages/x.sh", "packages/y.run", "packages/wheels/*.whl", "packages/build/a.run",
                     "packages/sub/b.sh", "packages/c.sh", "packages/d.run"]
    assert writes.written == ["packages/build"]  # mkdir build, in packages/


def test_an_escape_directive_sets_the_line_continuation_character() -> None:
    """# escape=` (Windows images) makes ` the continuation character: a backslash at a line's end was read as one,
    joining two RUN steps into one. The directive counts only at the very top, before any other line."""
    steps = [step for step in dockerfile_instructions("# syntax=docker/dockerfile:1\n# escape=`\nFROM x\n"
                                                      "RUN echo a \\\nRUN pip install `\n  packages/k.whl\n")
             if step.keyword == "RUN"]
    assert [(step.line, step.text) for step in steps] == [(4, "echo a \\"), (5, "pip install packages/k.whl")]
    late = dockerfile_instructions("\n# escape=`\nFROM x\nRUN echo a \\\n  b\n")
    assert [step.text for step in late if step.keyword == "RUN"] == ["echo a b"]


def test_a_line_with_a_script_heredoc_and_a_data_heredoc_runs_only_the_script() -> None:
    """RUN bash <<SCRIPT && cat <<CONF > /etc/pip.conf read both bodies as shell (the data's find-links = packages/...
    was said missing), and with cat first neither (the script's missing wheel went unsaid). Each heredoc is a script
    only where a shell reads it (its command a shell with options only), as the shell BuildKit hands the line to
    runs it; RUN <<EOF alone runs its body."""
    text = ("FROM x\nRUN bash <<SCRIPT && cat <<CONF > /etc/pip.conf\npip install packages/a.whl\nSCRIPT\n"
            "find-links = packages/wheels\nCONF\n"
            "RUN cat <<CONF >/etc/x && sudo -E bash -e <<SCRIPT\nfind-links = packages/w\nCONF\ncd packages\n./b.sh\n"
            "SCRIPT\nRUN <<EOF\npip install packages/c.whl\nEOF\nRUN bash -c 'true' <<DATA\npackages/d.whl\nDATA\n")
    scripts = [run_scripts(step) for step in dockerfile_instructions(text) if step.keyword == "RUN"]
    assert scripts == [["bash <<SCRIPT && cat <<CONF > /etc/pip.conf", "pip install packages/a.whl"],
                       ["cat <<CONF >/etc/x && sudo -E bash -e <<SCRIPT", "cd packages\n./b.sh"],
                       ["pip install packages/c.whl"], ["bash -c 'true' <<DATA"]]


def test_after_a_cd_only_a_word_the_shell_opens_as_a_file_is_looked_for() -> None:
    """After cd packages, any word with a / or a file's ending was read as a file of packages/: a sed expression,
    echo's text, a git branch, a mirror's address were said missing. Now only the program by a path, a shell's
    script, an input redirection's file and an argument ending like a file (no blank in it) are, and none of a
    command whose arguments are text or patterns (echo, printf, sed, grep, awk, git, test, [)."""
    named = each("cd packages/apex && sed -i 's/check_cuda_torch_binary_vs_bare_metal(CUDA_HOME)/pass/' setup.py",
                    'cd packages && echo "installing a.run" && printf "%s" b.run && sh a.run',
                    "cd packages && git checkout origin/main && grep -l x c.sh && awk -f d.awk e.txt",
                    "cd packages && echo a/b > notes.txt && pip install -i mirrors.aliyun.com/pypi/simple torch",
                    "cd packages && ./f/setup.sh --prefix=/opt && bash -e g.sh && python setup.py install < h.in",
                    "cd packages && pip install wheels/*.whl ./local/ && tar xzf i.tar.gz -C /opt && [ -e j.run ]")
    assert named == ["packages/apex", "packages/a.run", "packages/f/setup.sh", "packages/g.sh", "packages/setup.py",
                     "packages/h.in", "packages/wheels/*.whl", "packages/i.tar.gz"]


def test_a_name_the_line_tests_for_first_is_guarded() -> None:
    """cd packages && if [ -f opt.run ]; then sh opt.run; fi was said missing where opt.run is absent, though the
    build goes on without it. A name a test of a file (test -f, [ -e ], [[ -s ]]) looks for in the same line is
    guarded (vendor check makes it a note); the test's operand itself is no name, with or without a cd."""
    writes = BuildWrites()
    lines = ["cd packages && if [ -f opt.run ]; then sh opt.run; fi", "test -e ./packages/b.run && sh packages/b.run",
             "sh packages/c.run; [ -f packages/d.run ]", "[[ -s packages/e.run ]] || echo packages/e.run"]
    assert [[(found.path, found.guarded) for found in writes.read(shell_words(line))] for line in lines] == [
        [("packages/opt.run", True)], [("packages/b.run", True)], [("packages/c.run", False)], []]


def test_a_cd_in_a_pipeline_in_the_background_or_in_a_function_moves_no_later_command() -> None:
    """cd packages & sh x.run, cd packages | true; sh x.run and f() { cd packages; } moved the folder for what came
    after, as a plain cd does: x.run was looked for in packages/. Each command of a pipeline and an and-or list
    run with & are subshells, and a function's body runs where it is called: none moves the shell; a list run in the
    background runs in the folder its own cd went to."""
    named = each("cd packages & sh a.run", "cd packages | true; sh b.run", "true | cd packages; sh c.run",
                    "f() { cd packages; }; sh d.run", "function g { cd packages; }; sh e.run",
                    "cd packages && sh f.run & sh g.run", "cd packages; cat x | sort; sh h.run")
    assert named == ["packages/f.run", "packages/h.run"]


def test_a_cd_to_where_copy_put_the_context_or_to_workdir_is_a_cd_into_the_context() -> None:
    """COPY . /workspace/docker_image/ and RUN cd /workspace/docker_image && sh packages/driver.run: a cd to an
    absolute path made every later name unknown, so a missing driver.run passed. A COPY of the context (or of
    packages/) and WORKDIR tell the shell where the context is; a cd elsewhere still makes the place unknown, and a
    path written there is the context's too."""
    writes = BuildWrites()
    for step in dockerfile_instructions("FROM x\nCOPY . /workspace/docker_image/\nWORKDIR /w\nWORKDIR sub\n"
                                        "COPY packages/ /opt/pkgs\nRUN true\n"):
        writes.work(step) if step.keyword == "WORKDIR" else writes.copy(step) if step.keyword == "COPY" else None
    assert writes.places == {"/workspace/docker_image": "", "/opt/pkgs": "packages"} and writes.workdir == "/w/sub"
    named = []
    for line in ["cd /workspace/docker_image && sh packages/a.run", "cd /workspace/docker_image/packages/x && ./b.sh",
                 "cd /opt/pkgs && sh c.run && cd /w/sub && sh packages/d.run && cd /elsewhere && sh packages/e.run",
                 "mkdir -p /workspace/docker_image/packages/made"]:
        named += [found.path for found in writes.read(shell_words(line), writes.shell())]
    assert named == ["packages/a.run", "packages/x/b.sh", "packages/c.run", "packages/d.run"]
    assert writes.made("packages/made/f.run") and not writes.made("packages/a.run")


def test_thousands_of_written_and_named_paths_are_judged_as_few_are() -> None:
    """Each name was matched against every written path (3000 mkdir and sh pairs: minutes). Written paths are
    looked up now; what is judged is the same: under a written folder, a folder leading to one, a glob matching
    one, or none of these."""
    lines = [f"mkdir -p packages/d{index} && sh packages/d{index}/x.run && sh packages/n{index}.run"
             for index in range(3000)]
    named, writes = read(*lines, "mkdir -p packages/g/${VER}/lib")
    assert len(named) == 9001 and len(writes.written) == 3001  # mkdir names its folder too
    assert [path for path in named if not writes.made(path)] == [f"packages/n{index}.run" for index in range(3000)]
    assert writes.made("packages/d7") and writes.made("packages/d*") and writes.made("packages/g/1.2/lib/a.so")
    assert writes.made("packages/g/*") and not writes.made("packages/g/1.2/other")
    assert not writes.made("packages/e*") and writes.made("packages/*")


def test_a_heredoc_piped_to_a_shell_or_fed_to_one_with_valued_options_is_its_script() -> None:
    """cat <<EOF | bash, bash -o pipefail <<EOF and bash --norc <<EOF were read as data (the script's packages/ paths
    never looked for): a shell's options may take a value (-o pipefail) and a long one is never -c. A heredoc cat
    hands a shell through a pipe is that shell's script; one fed to a shell with a script file is the script's
    data."""
    text = ("FROM x\nRUN cat <<A | sudo bash -e\nsh packages/a.run\nA\nRUN bash -o pipefail <<B\nsh packages/b.run\nB\n"
            "RUN bash --norc -s -- x <<C\nsh packages/c.run\nC\nRUN bash run.sh <<D\npackages/d.run\nD\n"
            "RUN cat <<E | grep x\npackages/e.run\nE\n")
    scripts = [run_scripts(step)[1:] for step in dockerfile_instructions(text) if step.keyword == "RUN"]
    assert scripts == [["sh packages/a.run"], ["sh packages/b.run"], ["sh packages/c.run"], [], []]


def test_a_shells_valued_options_are_no_script_and_s_reads_its_input() -> None:
    """After cd packages, bash -o pipefail -c '...' named packages/pipefail, bash -O extglob x.sh packages/extglob and
    bash -s -- -y full packages/full. A shell's options are walked as it reads them: -o, +O, --rcfile take a value,
    -c runs a string, -s (or -) its input; the first other word is its script, and a shell's other words are its
    script's arguments, none of them a file it opens."""
    named, _ = read("cd packages", "bash -o pipefail -c 'sh a.run'", "bash -O extglob x.sh", "bash -s -- -y full",
                    "bash -eo pipefail +O extglob --rcfile rc y.sh arg.sh", "bash -- z.sh", "sh - w.sh")
    assert named == ["packages/x.sh", "packages/y.sh", "packages/z.sh"]


def test_a_test_guards_its_file_for_the_rest_of_the_script() -> None:
    """if [ -f packages/opt.run ]; then / sh packages/opt.run / fi, and test -f opt.run || { echo skip; exit 0; } /
    sh opt.run, said the installer missing: a guard covered its own line only. It covers the rest of the shell's
    script now; a name no test looked for is still unguarded."""
    writes, shell = BuildWrites(), Shell()
    lines = ["if [ -f packages/opt.run ]; then", "  sh packages/opt.run", "fi", "cd packages",
             "test -f b.run || { echo skip; exit 0; }", "sh b.run", "sh c.run"]
    assert [(found.path, found.guarded) for line in lines for found in writes.read(shell_words(line), shell)] == [
        ("packages/opt.run", True), ("packages/b.run", True), ("packages/c.run", False)]


def test_what_rm_removes_and_an_archive_tar_or_zip_writes_is_no_file_needed() -> None:
    """After cd packages, rm -f old.tar.gz, tar czf logs.tgz /var/log and zip out.zip ... were said missing from
    packages/: rm needs no file, and the archive tar c (-f's value, wherever it is in the letters) and zip (its first
    argument) write is made by the build. What tar x reads still is a name."""
    named, writes = read("cd packages", "rm -f old.tar.gz packages/x.run", "tar czf logs.tgz /var/log",
                         "tar -c -v -f b.tar logs", "tar --create --file=c.tar logs", "tar cCf /tmp d.tar .",
                         "zip -r out.zip logs", "tar xzf in.tgz -C /opt", "tar czf e.tgz a.sh")
    assert [path for path in named if not writes.made(path)] == ["packages/in.tgz", "packages/a.sh"]
    assert [path for path in writes.written if path.startswith("packages/")] == [
        "packages/logs.tgz", "packages/b.tar", "packages/c.tar", "packages/d.tar", "packages/out.zip", "packages/e.tgz"]


def test_a_data_heredoc_body_in_a_script_is_no_shell_line() -> None:
    """cat > /etc/pip.conf <<EOF / find-links = packages/wheels / EOF in an install script had its body read as
    shell: packages/wheels said missing. A data heredoc's body is passed over up to its end word (<<-: tabs before
    it); one a shell reads (bash <<EOF) is read as lines, with their own numbers."""
    script = ("cat > /etc/pip.conf <<EOF\n[global]\nfind-links = packages/wheels\nEOF\ncat<<-'X' >> f\n\tsh a\n"
              "\tX\nbash -e << S\nsh packages/b.run\nS\nsh packages/c.run\necho '<<EOF'\nsh packages/d.run\n")
    assert shell_lines(script) == [(1, "cat > /etc/pip.conf <<EOF"), (5, "cat<<-'X' >> f"), (8, "bash -e << S"),
                                   (9, "sh packages/b.run"), (11, "sh packages/c.run"), (12, "echo '<<EOF'"),
                                   (13, "sh packages/d.run")]


def test_heredocs_are_found_as_docker_and_the_shell_find_them() -> None:
    """A << in quotes, in $(( )), a here string (<<<) or the exec form opens no heredoc; for Docker one opens where a
    word starts with it (2<<EOF too), for the shell also inside a word and before a blank (cat<<EOF, << EOF)."""
    def found(line: str, shell: bool = False) -> list[str]:
        return [match.group(3) for match in heredocs(line, shell=shell)]
    assert found("printf 'a << \"b\"' \"<<C\" $((1<<N)) $(( (2) << M )) <<<word") == []
    assert found('["bash", "-c", "cat <<EOF"]') == [] and found("cat <<A 2<<'B' x<<C << D") == ["A", "B"]
    assert found("cat<<A << B $((1<<N)) '<<C'", shell=True) == ["A", "B"]


def test_an_empty_array_is_no_function() -> None:
    """NAME=() was read as a function's name and (): the group after it taken for the body, its cd and the missing
    installer passed over. An assignment's () is an empty array."""
    named, _ = read("PKGS=()", "{ cd packages && sh missing.run; }")
    assert named == ["packages/missing.run"]
