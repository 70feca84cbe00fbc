//! `KEYS` and `ARGV` of each call, as the scripts' headers give them.

use super::*;

#[test]
fn keys_and_argv_follow_the_script_headers() {
    let b = TokenBucket {
        capacity: 10,
        rate: 1,
        per_ms: 1_000,
    };
    let take = Call::take("tl:{r:k}", b, 2, 5).at(7);
    assert_eq!(take.keys(), ["tl:{r:k}"]);
    let ints = [10, 1, 1_000, 2, 5, 7].map(Arg::Int);
    assert_eq!(take.args(), ints);
    let banned = Call::take_or_ban("tl:{r:k}", b, 1, 60_000);
    assert_eq!(banned.keys(), ["tl:{r:k}", "tl:{r:k}:ban"]);
    assert_eq!(banned.args(), [10, 1, 1_000, 1, 1, 60_000].map(Arg::Int));
    let log = Call::sliding_log("tl:{l:u}", (60_000, 5), 1, 0, "m-1");
    assert_eq!(
        log.args(),
        [Arg::Int(60_000), Arg::Int(5), Arg::Int(1), Arg::Str("m-1"), Arg::Int(0)]
    );
    let rolling = Call::fixed_window("tl:{f:u}", (1_000, 3), 1, 0, None);
    assert_eq!(rolling.args().last(), Some(&Arg::Int(-1)));
    let queue = LeakyBucket { rate: 5, per_ms: 1_000 };
    let reserve = Call::reserve("tl:{q:j}", queue, 1, 30_000, "m-2");
    assert_eq!(
        reserve.args(),
        [
            Arg::Int(5),
            Arg::Int(1_000),
            Arg::Int(1),
            Arg::Int(30_000),
            Arg::Str("m-2")
        ]
    );
    let release = Call::release("tl:{q:j}", queue, 1, "m-2");
    assert_eq!(release.args()[3], Arg::Str("m-2"));
    assert_eq!(Call::give_back("tl:{r:k}", b, 3).args()[3], Arg::Int(3));
    let mark = std::time::Duration::from_secs(12);
    let once = Call::give_back("tl:{r:k}", b, 3).once("p.1-8", mark);
    assert_eq!(once.keys(), ["tl:{r:k}", "tl:{r:k}:return:p.1-8"]);
    assert_eq!(
        once.args(),
        [10, 1, 1_000, 3, 12_000, -1].map(Arg::Int),
        "the mark kept 12 s; no lease's stamp"
    );
    let lent = [(1_700_000_000_000_007, 2), (1_700_000_000_001_000, 1)].map(|(stamp, tokens)| Lent { stamp, tokens });
    let since = Call::give_back("tl:{r:k}", b, 0)
        .once("p.1-8", mark)
        .since(lent.to_vec());
    assert_eq!(since.args()[3], Arg::Int(3), "the tokens of the leases named");
    assert_eq!(since.args()[5], Arg::Lent(&lent));
    assert_eq!(Lent::encode(&lent), "1700000000000007:2,1700000000001000:1");
    assert_eq!(store_key("tl", "sku_buy", "sku:42"), "tl:{sku_buy:sku:42}");
}
