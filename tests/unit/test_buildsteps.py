"""flagperf.hosts.buildsteps: a Dockerfile and an install script read as Docker and the shell run them, for vendor
check's packages/ check (tests/unit/test_vendor_check.py holds the check itself)."""

from __future__ import annotations

from flagperf.hosts.buildsteps import BuildWrites, Shell, dockerfile_instructions, run_scripts, shell_words


def read(*lines: str) -> tuple[list[str], BuildWrites]:
    """The packages/ paths the lines (one shell's, in order) name, as paths of the context, and what they write."""
    writes, shell, named = BuildWrites(), Shell(), []
    for line in lines:
        named += [path for _, path in writes.read(shell_words(line), shell)]
    return named, writes


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
