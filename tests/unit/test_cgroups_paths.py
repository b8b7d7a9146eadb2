from pathlib import PurePosixPath

import pytest

from nri_midbatch.cgroups.paths import (
    CgroupDriver,
    CgroupLocation,
    CgroupPathError,
    kubelet_root,
    resolve_driver,
)

AUTO = CgroupDriver.AUTO
CGROUPFS = CgroupDriver.CGROUPFS
SYSTEMD = CgroupDriver.SYSTEMD


@pytest.mark.parametrize(
    ("driver", "parent", "expected"),
    [
        (AUTO, "kubepods-besteffort-pod1.slice", SYSTEMD),
        (AUTO, "/kubepods/besteffort/pod1", CGROUPFS),
        (AUTO, "/kubepods.slice/kubepods-pod1.slice", SYSTEMD),
        (CGROUPFS, "kubepods-pod1.slice", CGROUPFS),
        (SYSTEMD, "/kubepods/pod1", SYSTEMD),
    ],
)
def test_resolve_driver(driver: CgroupDriver, parent: str, expected: CgroupDriver) -> None:
    assert resolve_driver(driver, parent) is expected


@pytest.mark.parametrize(
    ("parent", "expected"),
    [
        ("/kubepods/besteffort/pod1234-5678", "kubepods/besteffort/pod1234-5678"),
        ("/kubepods/burstable/podabc", "kubepods/burstable/podabc"),
        ("/kubepods/podabc", "kubepods/podabc"),
        ("kubepods/podabc", "kubepods/podabc"),
        ("//kubepods///podabc/", "kubepods/podabc"),
    ],
)
def test_cgroupfs_parent_is_relative_to_root(parent: str, expected: str) -> None:
    assert CgroupLocation(CGROUPFS, parent).relpath() == PurePosixPath(expected)
    assert CgroupLocation(AUTO, parent).relpath() == PurePosixPath(expected)


@pytest.mark.parametrize(
    ("parent", "expected"),
    [
        (
            "kubepods-besteffort-pod1234_5678.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_5678.slice",
        ),
        (
            "kubepods-burstable-podabc.slice",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podabc.slice",
        ),
        ("kubepods-podabc.slice", "kubepods.slice/kubepods-podabc.slice"),
        # Already expanded: used as a path.
        (
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
        ),
    ],
)
def test_systemd_slice_expansion(parent: str, expected: str) -> None:
    assert CgroupLocation(SYSTEMD, parent).relpath() == PurePosixPath(expected)
    assert CgroupLocation(AUTO, parent).relpath() == PurePosixPath(expected)


@pytest.mark.parametrize(
    "parent",
    [
        "../../etc",
        "/kubepods/../../x",
        "/kubepods/..",
        "..",
        "/kubepods/./pod1",
        "/kubepods/pod1\x00/x",
        "/kubepods/pod\ud800",
        "",
        "/",
        "///",
    ],
)
@pytest.mark.parametrize("driver", [AUTO, CGROUPFS, SYSTEMD])
def test_refuses_parents_that_are_not_plain_downward_paths(
    parent: str, driver: CgroupDriver
) -> None:
    with pytest.raises(CgroupPathError) as info:
        CgroupLocation(driver, parent).relpath()
    assert repr(parent) in str(info.value)


@pytest.mark.parametrize(
    "parent",
    [
        "kubepods--pod1.slice",
        "-kubepods.slice",
        "kubepods-.slice",
        "-.slice",
        ".slice",
        "kubepods-pod1",
        "/kubepods.slice/../../etc.slice",
    ],
)
def test_refuses_bad_systemd_names(parent: str) -> None:
    with pytest.raises(CgroupPathError, match="cgroup parent"):
        CgroupLocation(SYSTEMD, parent).relpath()


def test_container_location_cgroupfs() -> None:
    assert CgroupLocation(
        CGROUPFS, "/kubepods/besteffort/pod1", "abc123"
    ).relpath() == PurePosixPath("kubepods/besteffort/pod1/abc123")


def test_container_location_systemd_uses_containerd_scope() -> None:
    assert CgroupLocation(
        AUTO, "kubepods-besteffort-pod1.slice", "abc123"
    ).relpath() == PurePosixPath(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/"
        "cri-containerd-abc123.scope"
    )


@pytest.mark.parametrize(
    ("runtime", "parent", "expected"),
    [
        ("containerd", "/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/abc123"),
        ("cri-o", "/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/crio-abc123"),
        ("CRI-O", "/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/crio-abc123"),
        (
            "cri-o",
            "kubepods-besteffort-pod1.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/"
            "crio-abc123.scope",
        ),
        (
            "containerd",
            "kubepods-besteffort-pod1.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/"
            "cri-containerd-abc123.scope",
        ),
        # Unknown or not yet configured: containerd's naming.
        ("", "/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/abc123"),
        ("podman", "/kubepods/besteffort/pod1", "kubepods/besteffort/pod1/abc123"),
    ],
)
def test_container_location_follows_the_runtimes_naming(
    runtime: str, parent: str, expected: str
) -> None:
    assert CgroupLocation(AUTO, parent, "abc123", runtime=runtime).relpath() == PurePosixPath(
        expected
    )


def test_container_location_prefers_the_runtimes_own_path_over_its_naming() -> None:
    got = CgroupLocation(
        AUTO, "/kubepods/besteffort/pod1", "abc123", "/kubepods/pod2/other-abc123", runtime="cri-o"
    ).relpath()
    assert got == PurePosixPath("kubepods/pod2/other-abc123")


@pytest.mark.parametrize("container_id", ["", ".", "..", "a/b", "../x", "a\x00b"])
def test_container_location_refuses_ids_that_are_not_one_segment(container_id: str) -> None:
    with pytest.raises(CgroupPathError, match="/kubepods/pod1"):
        CgroupLocation(CGROUPFS, "/kubepods/pod1", container_id).relpath()


#: Parents a runtime or CRI client can send that name the node's own cgroups
#: (issue 24): every one of them was written, and held by systemd, before.
OUTSIDE_KUBEPODS = [
    "/system.slice",
    "system.slice",
    "/init.scope",
    "/system.slice/sshd.service",
    "/system.slice/containerd.service",
    "/user.slice/user-1000.slice/session-1.scope",
    "user-1000.slice",
    # kubepods itself, its QoS levels and what is not one: not pods.
    "kubepods.slice",
    "kubepods-besteffort.slice",
    "/kubepods.slice/kubepods-besteffort.slice",
    "/kubepods",
    "/kubepods/besteffort",
    "/kubepods/besteffort/pod",
    "/kubepods/guaranteed/pod1",
    "kubepods-guaranteed-pod1.slice",
    "kubepods-besteffort-pod1-x.slice",
    # A pod slice out of its place in the chain.
    "/kubepods-besteffort-pod1.slice",
    "/system.slice/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
    "/kubepods.slice/kubepods-pod1.slice/kubepods-besteffort-pod1.slice",
    "/custom/kubepods/besteffort/pod1",
    "/kubepods/besteffort/pod1/child",
]


#: kubelet's --cgroup-root on a KinD node.
KIND = kubelet_root("/kubelet")

#: With --cgroup-root=/kubelet, only /kubelet's kubepods holds pods: the default root's
#: pods, the root itself and anything beside its kubepods are refused.
OUTSIDE_KIND_KUBEPODS = [
    "/kubepods/besteffort/pod1",
    "kubepods-besteffort-pod1.slice",
    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
    "/kubelet",
    "kubelet.slice",
    "/kubelet/kubepods",
    "/kubelet/kubepods/besteffort",
    "kubelet-kubepods.slice",
    "kubelet-kubepods-besteffort.slice",
    "/kubelet/pod1",
    "kubelet-pod1.slice",
    "/kubelet/system.slice/pod1",
    "/kubelet/besteffort/pod1",
    "/other/kubelet/kubepods/pod1",
    "/kubelet/other/kubepods/pod1",
    "/kubelet/kubepods/besteffort/pod1/child",
    "/kubelet/kubepods/../kubepods/pod1",
    "kubelet-kubepods-besteffort-pod1-x.slice",
    "other-kubelet-kubepods-pod1.slice",
    # A slice out of its place in the chain.
    "/kubelet-kubepods-pod1.slice",
    "/kubelet.slice/kubelet-kubepods-pod1.slice",
    "/kubepods.slice/kubelet-kubepods.slice/kubelet-kubepods-pod1.slice",
    "/system.slice",
    "/init.scope",
]


@pytest.mark.parametrize(
    ("root", "parent"),
    [((), parent) for parent in OUTSIDE_KUBEPODS]
    + [(KIND, parent) for parent in OUTSIDE_KIND_KUBEPODS],
)
@pytest.mark.parametrize("driver", [AUTO, CGROUPFS, SYSTEMD])
def test_refuses_parents_that_are_not_kubelets_pod_cgroups(
    root: tuple[str, ...], parent: str, driver: CgroupDriver
) -> None:
    with pytest.raises(CgroupPathError, match="cgroup parent"):
        CgroupLocation(driver, parent, kubelet_root=root).relpath()
    with pytest.raises(CgroupPathError, match="cgroup parent"):
        CgroupLocation(driver, parent, "abc123", kubelet_root=root).relpath()


@pytest.mark.parametrize(
    "cgroups_path",
    [
        "system.slice:cri-containerd:abc123",
        "kubepods-besteffort.slice:cri-containerd:abc123",
        "/system.slice/sshd.service",
        "/system.slice/containerd.service",
        "/init.scope",
        "/kubepods/besteffort/pod1",
        "/kubepods/besteffort",
        "/kubepods/besteffort/pod1/abc123/deeper",
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/sshd.service",
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/.scope",
    ],
)
def test_refuses_container_paths_outside_kubelets_pod_cgroups(cgroups_path: str) -> None:
    with pytest.raises(CgroupPathError, match="cgroups path"):
        CgroupLocation(AUTO, "kubepods-besteffort-pod1.slice", "abc123", cgroups_path).relpath()


@pytest.mark.parametrize(
    ("cgroups_path", "expected"),
    [
        (
            "kubepods-besteffort-pod1.slice:cri-containerd:abc123",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/"
            "cri-containerd-abc123.scope",
        ),
        (
            "kubepods-pod1.slice:crio:abc123",
            "kubepods.slice/kubepods-pod1.slice/crio-abc123.scope",
        ),
        ("/kubepods/burstable/pod1/crio-abc123", "kubepods/burstable/pod1/crio-abc123"),
        ("/kubepods/pod1/abc123", "kubepods/pod1/abc123"),
    ],
)
def test_accepts_the_runtimes_container_paths_inside_pod_cgroups(
    cgroups_path: str, expected: str
) -> None:
    got = CgroupLocation(AUTO, "kubepods-besteffort-pod1.slice", "abc123", cgroups_path).relpath()
    assert got == PurePosixPath(expected)


# -- kubelet's --cgroup-root ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "names"),
    [("/", ()), ("/kubelet", ("kubelet",)), ("//a//b/", ("a", "b")), ("/my-root", ("my-root",))],
)
def test_kubelet_root_is_read_as_kubelets_flag(flag: str, names: tuple[str, ...]) -> None:
    assert kubelet_root(flag) == names


@pytest.mark.parametrize("flag", ["kubelet", "", "/a/../b", "/.", "/a\x00b"])
def test_kubelet_root_refuses_what_is_not_a_downward_absolute_path(flag: str) -> None:
    with pytest.raises(CgroupPathError) as info:
        kubelet_root(flag)
    assert repr(flag) in str(info.value)


@pytest.mark.parametrize(
    ("flag", "parent", "expected"),
    [
        # KinD: --cgroup-root=/kubelet, cgroupfs.
        ("/kubelet", "/kubelet/kubepods/besteffort/pod1", "kubelet/kubepods/besteffort/pod1"),
        ("/kubelet", "/kubelet/kubepods/pod1", "kubelet/kubepods/pod1"),
        # The same under systemd: the root's name leads every slice.
        (
            "/kubelet",
            "kubelet-kubepods-besteffort-pod1.slice",
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            "kubelet-kubepods-besteffort-pod1.slice",
        ),
        (
            "/kubelet",
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            "kubelet-kubepods-burstable-pod1.slice",
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            "kubelet-kubepods-burstable-pod1.slice",
        ),
        (
            "/kubelet",
            "kubelet-kubepods-pod1.slice",
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod1.slice",
        ),
        # Deeper roots; kubelet's systemd driver writes a name's `-` as `_`.
        ("/a/b", "/a/b/kubepods/pod1", "a/b/kubepods/pod1"),
        (
            "/a/b",
            "a-b-kubepods-pod1.slice",
            "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-pod1.slice",
        ),
        ("/my-root", "/my-root/kubepods/pod1", "my-root/kubepods/pod1"),
        (
            "/my-root",
            "my_root-kubepods-pod1.slice",
            "my_root.slice/my_root-kubepods.slice/my_root-kubepods-pod1.slice",
        ),
    ],
)
def test_pods_below_kubelets_cgroup_root(flag: str, parent: str, expected: str) -> None:
    root = kubelet_root(flag)
    assert CgroupLocation(AUTO, parent, kubelet_root=root).relpath() == PurePosixPath(expected)
    driver = SYSTEMD if parent.endswith(".slice") else CGROUPFS
    assert CgroupLocation(driver, parent, kubelet_root=root).relpath() == PurePosixPath(expected)


@pytest.mark.parametrize(
    ("parent", "cgroups_path", "runtime", "expected"),
    [
        (
            "/kubelet/kubepods/besteffort/pod1",
            "",
            "containerd",
            "kubelet/kubepods/besteffort/pod1/abc123",
        ),
        (
            "/kubelet/kubepods/besteffort/pod1",
            "/kubelet/kubepods/besteffort/pod1/crio-abc123",
            "cri-o",
            "kubelet/kubepods/besteffort/pod1/crio-abc123",
        ),
        (
            "kubelet-kubepods-besteffort-pod1.slice",
            "",
            "containerd",
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            "kubelet-kubepods-besteffort-pod1.slice/cri-containerd-abc123.scope",
        ),
        (
            "kubelet-kubepods-besteffort-pod1.slice",
            "kubelet-kubepods-besteffort-pod1.slice:crio:abc123",
            "cri-o",
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            "kubelet-kubepods-besteffort-pod1.slice/crio-abc123.scope",
        ),
    ],
)
def test_containers_below_kubelets_cgroup_root(
    parent: str, cgroups_path: str, runtime: str, expected: str
) -> None:
    location = CgroupLocation(AUTO, parent, "abc123", cgroups_path, runtime, KIND)
    assert location.relpath() == PurePosixPath(expected)


@pytest.mark.parametrize(
    "parent",
    ["/kubelet/kubepods/pod1", "kubelet-kubepods-pod1.slice", "my-root-kubepods-pod1.slice"],
)
def test_the_default_root_refuses_pods_of_another(parent: str) -> None:
    with pytest.raises(CgroupPathError, match=r"kubepods\[/<qos>\]/pod<uid>"):
        CgroupLocation(AUTO, parent).relpath()


def test_a_refusal_names_the_configured_roots_kubepods() -> None:
    with pytest.raises(
        CgroupPathError,
        match=r"kubelet/kubepods\[/<qos>\]/pod<uid>.*"
        r"kubelet-kubepods\[-<qos>\]-pod<uid>\.slice.*kubeletCgroupRoot",
    ):
        CgroupLocation(AUTO, "/kubepods/pod1", kubelet_root=KIND).relpath()


def test_a_systemd_root_name_with_a_dash_is_refused_unescaped() -> None:
    # kubelet writes /my-root's slices as my_root-...; `my-root-kubepods-...` would be a
    # root of two names, my and root.
    with pytest.raises(CgroupPathError):
        CgroupLocation(SYSTEMD, "my-root-kubepods-pod1.slice", kubelet_root=("my-root",)).relpath()


@pytest.mark.parametrize(
    "cgroups_path",
    [
        "kubepods-besteffort-pod1.slice:cri-containerd:abc123",
        "/kubepods/besteffort/pod1/abc123",
        "/kubelet/kubepods/besteffort/pod1",
        "/kubelet/kubepods/besteffort/pod1/abc123/deeper",
        "kubelet-kubepods-besteffort.slice:cri-containerd:abc123",
        "kubelet.slice:cri-containerd:abc123",
        "/kubelet/system.slice/sshd.service",
    ],
)
def test_refuses_container_paths_outside_the_configured_roots_kubepods(cgroups_path: str) -> None:
    with pytest.raises(CgroupPathError, match="cgroups path"):
        CgroupLocation(
            AUTO, "/kubelet/kubepods/besteffort/pod1", "abc123", cgroups_path, kubelet_root=KIND
        ).relpath()
