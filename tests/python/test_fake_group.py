"""init_process_group("fake"): one process plays one rank of a large world (Note [Fake process
group]); meshes of any size build without a transport, and collectives only count bytes."""
import subprocess
import sys
import textwrap


def test_fake_world_of_1024():
    # A fresh interpreter: the default group is per process.
    code = textwrap.dedent("""
        import kiln, kiln.distributed as dist
        from kiln.distributed.device_mesh import init_device_mesh
        dist.init_process_group("fake", rank=9, world_size=1024)
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (9, 1024, "fake")
        mesh = init_device_mesh("cpu", (128, 8), mesh_dim_names=("dp", "tp"))
        assert mesh.get_coordinate() == [1, 1] and mesh["tp"].size() == 8
        t = kiln.ones(4)
        dist.all_reduce(t)
        assert t.tolist() == [1.0] * 4           # untouched: nothing is exchanged
        dist.destroy_process_group()
        try:
            dist.init_process_group("fake")
        except ValueError as e:
            assert "rank and world_size" in str(e)
        else:
            raise AssertionError("no error")
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
