//! The crate docs' "adding a method" recipe, followed in a test: a small
//! method (per-sample hinge → mixture → the same hinge on the pairs called
//! clean; one network, no co-teaching) written only against the public
//! `Method` trait and run by the shared `Runner`.

use candle_core::{Device, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::{
    ImageInputs, ImageTowerConfig, ModelConfig, PairInputs, TextInputs, TextTowerConfig,
};
use ncclean_pipelines::division::CleanSide;
use ncclean_pipelines::losses::per_sample_hinge;
use ncclean_pipelines::method::{Batch, EpochCtx, Method, Plan, ScoreCtx};
use ncclean_pipelines::scoring::{divide, hinge_pass, StatPass};
use ncclean_pipelines::{Error, PairScores, Pipeline, Result, Runner, Silent, TrainConfig};

/// The whole method: its state is which pairs the last division kept.
struct CleanHinge {
    kept: usize,
}

impl Method for CleanHinge {
    const NAME: &'static str = "clean-hinge";
    type Pass = StatPass;

    fn new(_cfg: &TrainConfig, _model: &ModelConfig) -> Result<Self> {
        Ok(CleanHinge { kept: 0 })
    }

    fn plan(&mut self, ctx: &mut EpochCtx) -> Result<Plan> {
        let pass = hinge_pass(&ctx.nets[0], ctx.data, ctx.cfg, (&mut *ctx.rng).into())?;
        let prob = divide(&pass.statistic, ctx.cfg, CleanSide::LowMean);
        let train: Vec<usize> = (0..prob.len()).filter(|&i| prob[i] > 0.5).collect();
        self.kept = train.len();
        Ok(Plan {
            clean_fraction: Some(train.len() as f64 / prob.len() as f64),
            train: vec![train],
            phase: "clean".into(),
        })
    }

    fn batch_loss(&mut self, b: &Batch) -> Result<Tensor> {
        let s = b.net.batch_similarity(b.data, b.idx)?;
        Ok(per_sample_hinge(&s, b.cfg.margin)?.mean_all()?)
    }

    fn clean_side(&self) -> CleanSide {
        CleanSide::LowMean
    }

    fn score_pass(&self, ctx: &ScoreCtx) -> Result<StatPass> {
        // Not `hinge_score_pass`: a method that hands its captions to no
        // caption null still scores (the clean model embeds them itself).
        hinge_pass(&ctx.nets[0], ctx.data, ctx.cfg, ctx.shuffles())
    }

    fn statistic(pass: &StatPass) -> &[f32] {
        &pass.statistic
    }

    fn scores(&self, pass: StatPass, clean_prob: Vec<f32>, _cfg: &TrainConfig) -> PairScores {
        PairScores {
            soft_label: clean_prob.clone(),
            clean_prob,
            similarity: pass.similarity,
            statistic: pass.statistic,
        }
    }
}

const DIM: usize = 8;

/// `n` pairs whose caption features are noisy copies of their image's,
/// except the last quarter, whose captions are rotated among themselves.
fn data(n: usize) -> (PairInputs, Vec<bool>) {
    let mut rng = Rng::new(11);
    let img: Vec<f32> = (0..n * DIM).map(|_| rng.normal() as f32).collect();
    let mut txt = img.clone();
    let noisy = n / 4;
    for k in 0..noisy {
        let (a, b) = (n - noisy + k, n - noisy + (k + 1) % noisy);
        txt[a * DIM..(a + 1) * DIM].copy_from_slice(&img[b * DIM..(b + 1) * DIM]);
    }
    for v in txt.iter_mut() {
        *v += 0.1 * rng.normal() as f32;
    }
    let inputs = PairInputs {
        images: ImageInputs::Embeddings {
            data: img,
            dim: DIM,
            local: None,
        },
        texts: TextInputs::Embeddings {
            data: txt,
            dim: DIM,
            local: None,
        },
    };
    ((inputs), (0..n).map(|i| i >= n - noisy).collect())
}

fn model() -> ModelConfig {
    ModelConfig {
        image: ImageTowerConfig::Precomputed {
            dim: DIM,
            local_dim: None,
        },
        text: TextTowerConfig::Precomputed {
            dim: DIM,
            local_dim: None,
        },
        joint_dim: 8,
        hidden: 16,
        head: Default::default(),
    }
}

fn config() -> TrainConfig {
    let sets: Vec<String> = [
        "epochs=8",
        "warmup_epochs=3",
        "batch_size=16",
        "lr=1e-2",
        "lr_decay_epochs=[]",
    ]
    .map(String::from)
    .to_vec();
    let over = ncclean_pipelines::config::parse_sets(&sets).expect("sets parse");
    ncclean_pipelines::presets::resolve("vanilla", None, &over).expect("config resolves")
}

fn fit(data: &PairInputs) -> Result<Runner<CleanHinge>> {
    let mut run = Runner::<CleanHinge>::new(config(), &model(), 5, &Device::Cpu)?;
    for e in 0..run.total_epochs() {
        let st = run.run_epoch(e, data, &mut Silent)?;
        assert!(st.loss.is_finite());
        assert_eq!(st.phase, if e < 3 { "warmup" } else { "clean" });
    }
    run.finalize(data, &[data.len()], &mut Silent)?;
    Ok(run)
}

#[test]
fn a_method_written_through_the_recipe_trains_and_scores() -> Result<()> {
    let (inputs, noisy) = data(96);
    let run = fit(&inputs)?;
    assert!(run.method_ref().kept > 0 && run.method_ref().kept < 96);
    let scores = run.score(&inputs, &[inputs.len()], false, &mut Silent)?;
    assert_eq!(scores.clean_prob.len(), 96);
    // Detection: the probability that a random clean pair scores above a
    // random noisy pair (AUROC), computed by counting.
    let (mut above, mut total) = (0usize, 0usize);
    for (i, &ni) in noisy.iter().enumerate() {
        for (j, &nj) in noisy.iter().enumerate() {
            if !ni && nj {
                total += 1;
                above += usize::from(scores.clean_prob[i] > scores.clean_prob[j]);
            }
        }
    }
    let auroc = above as f64 / total as f64;
    assert!(auroc > 0.9, "AUROC {auroc}");

    // The runner's seed streams make the whole run reproducible.
    let again = fit(&inputs)?.score(&inputs, &[inputs.len()], false, &mut Silent)?;
    assert_eq!(again, scores);

    // Scoring needs the final division, and says so with a state error.
    let fresh = Runner::<CleanHinge>::new(config(), &model(), 5, &Device::Cpu)?;
    let e = fresh
        .score(&inputs, &[inputs.len()], false, &mut Silent)
        .expect_err("not fitted");
    assert!(matches!(e, Error::State(_)), "{e}");
    assert!(e.to_string().contains("run fit first"), "{e}");
    Ok(())
}
