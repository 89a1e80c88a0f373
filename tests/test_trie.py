from llamadecide.engine.trie import build_trie, continuation_paths, plan_groups


def test_shared_prefixes_are_one_node():
    nodes = build_trie(9, [[1, 2, 3], [1, 2, 4], [5]])
    # root, 1, 5, 2, 3, 4
    assert len(nodes) == 6
    assert nodes[0].token == 9 and nodes[0].members == [0, 1, 2]
    one = nodes[nodes[0].children[1]]
    assert one.members == [0, 1]
    assert sorted(n.depth for n in nodes) == [0, 1, 1, 2, 3, 3]


def test_breadth_first_order_puts_parents_first():
    nodes = build_trie(0, [[1, 2, 3, 4], [5, 6], [1, 7]])
    for index, node in enumerate(nodes):
        if node.parent >= 0:
            assert node.parent < index
            assert nodes[node.parent].depth == node.depth - 1
    depths = [n.depth for n in nodes]
    assert depths == sorted(depths)


def test_paths_point_at_the_predicting_node():
    continuations = [[1, 2], [1, 3], [4]]
    nodes = build_trie(0, continuations)
    paths = continuation_paths(nodes, continuations)
    assert paths[0][0] == 0 and paths[2][0] == 0
    assert nodes[paths[0][1]].token == 1
    assert paths[0][1] == paths[1][1]


def test_a_prefix_option_ends_inside_the_longer_path():
    # "bill" + END is [7, 2]; "billing" + END is [7, 8, 2]: distinct leaves, shared first node.
    nodes = build_trie(0, [[7, 2], [7, 8, 2]])
    seven = nodes[nodes[0].children[7]]
    assert set(seven.children) == {2, 8}


def test_groups_respect_member_and_node_limits():
    conts = [[i, 100 + i] for i in range(10)]
    groups = plan_groups(conts, max_members=4, max_nodes=1000)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    groups = plan_groups(conts, max_members=100, max_nodes=1 + 2 * 3)
    assert groups == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_groups_count_shared_nodes_once():
    shared = [[1, 2, 3, 4, 5, i] for i in range(6)]
    # 1 root + 5 shared + 6 leaves = 12 nodes fit in one group of 12
    assert plan_groups(shared, max_members=100, max_nodes=12) == [list(range(6))]
    assert len(plan_groups(shared, max_members=100, max_nodes=11)) == 2
